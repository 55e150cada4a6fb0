"""The simulated engine's tokenizer and generator, in-process: exact ids, exact text."""

from __future__ import annotations

import pytest

from supervisor.sim import tokens
from supervisor.sim.generate import Generator, seed
from supervisor.sim.replies import GenerationSettings, RequestError, plan_completion

TEXTS = [
    "the stream continues",
    "café naïve über Zürich 日本 🙂 — ✓",
    "  leading spaces,\n\nnewlines; and punctuation!?",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_encoding_then_decoding_gives_the_text_back(text):
    assert tokens.BASE.decode(tokens.BASE.encode(text)) == text


def test_characters_outside_the_vocabulary_split_into_byte_tokens():
    ids = tokens.BASE.encode("日")
    assert [tokens.BASE.piece(i) for i in ids] == [b"\xe6", b"\x97", b"\xa5"]
    assert tokens.BASE.decode(ids[:2]) == "\ufffd"  # half a character decodes as U+FFFD


def test_an_engines_words_are_one_token_each_and_never_move_the_base_ids():
    engine = tokens.Tokenizer(("Hello", " qwen-small,"))
    assert engine.encode("Hello qwen-small,") == [tokens.BASE.size, tokens.BASE.size + 1]
    assert engine.vocab[: tokens.BASE.size] == tokens.BASE.vocab
    assert engine.encode("the stream") == tokens.BASE.encode("the stream")


def test_out_of_vocabulary_finds_the_first_bad_entry():
    assert tokens.BASE.out_of_vocabulary([0, 5, 6]) is None
    assert tokens.BASE.out_of_vocabulary([5, tokens.BASE.size, -1]) == tokens.BASE.size
    assert tokens.BASE.out_of_vocabulary([5, True]) is True


def test_the_incremental_decoder_holds_back_a_character_until_it_is_complete():
    decoder = tokens.IncrementalDecoder(tokens.BASE)
    deltas = [decoder.push(i) for i in tokens.BASE.encode(" 🙂!")]
    assert deltas == [" ", "", "", "", "🙂", "!"]
    assert decoder.push(tokens.EOS_ID) == ""


def test_the_chat_template_marks_roles_and_ends_with_the_generation_prompt():
    ids = tokens.BASE.render_chat([{"role": "user", "content": "hi"}])
    assert ids[0] == tokens.ROLE_IDS["user"] and ids[-2:] == [tokens.END_ID, 3]
    assert tokens.BASE.decode(ids) == "<|user|>hi<|end|><|assistant|>"


def _generate(prompt: list[int], count: int, model: str = "m") -> list[int]:
    generator = Generator(tokens.BASE, seed(model), prompt)
    return [generator.next_id() for _ in range(count)]


def test_generation_depends_only_on_the_context_ids():
    prompt = tokens.BASE.render_chat([{"role": "user", "content": "tell me"}])
    answer = _generate(prompt, 120)
    assert _generate(prompt, 120) == answer  # no per-instance state
    for k in range(0, 120, 7):
        assert _generate(prompt + answer[:k], 120 - k) == answer[k:]
    assert _generate(prompt, 120, model="other") != answer
    text = tokens.BASE.decode(answer)
    assert any(len(ch.encode()) > 1 for ch in text)  # multi-byte characters appear
    assert "\ufffd" not in text[:-1]  # whole characters (only the very end may be cut)


def _plan(payload: dict, *, chat: bool, **settings) -> object:
    """The whole generated answer (the engine produces it step by step as it streams)."""
    return plan_completion(
        request_id="cmpl-test",
        created=1,
        model="m",
        body=b"{}",
        payload={"model": "m", **payload},
        chat=chat,
        reply="unused",
        echo=False,
        generation=GenerationSettings(seed=seed("m"), max_model_len=4096, **settings),
    ).whole()


def _chat(max_tokens: int, **extra) -> dict:
    return {"messages": [{"role": "user", "content": "go"}], "max_tokens": max_tokens, **extra}


def test_a_generated_answer_is_as_long_as_max_tokens_asks():
    c = _plan(_chat(300), chat=True)
    assert len(c.ids) == 300 and c.finish_reason == "length"
    prompt = len(tokens.BASE.render_chat(_chat(1)["messages"]))
    assert c.usage() == {
        "prompt_tokens": prompt,
        "completion_tokens": 300,
        "total_tokens": prompt + 300,
    }
    assert "".join(c.tokens) == tokens.BASE.decode(c.ids)


def test_a_stop_string_ends_the_answer_and_its_start_is_held_back():
    whole = _plan(_chat(200), chat=True)
    # A word that first appears some way into the answer.
    stop = next(w for w in whole.text.split() if whole.text.index(f" {w}") > 20)
    cut = whole.text.index(f" {stop}")
    c = _plan(_chat(200, stop=[f" {stop}"]), chat=True)
    assert c.text == whole.text[:cut]
    assert (c.finish_reason, c.stop_reason) == ("stop", f" {stop}")
    assert c.ids == whole.ids[: len(c.ids)]
    # No chunk before the last ever carried the stop string's first characters.
    sent = ""
    for delta in c.tokens[:-1]:
        sent += delta
        assert len(sent) <= cut
    kept = _plan(_chat(200, stop=[f" {stop}"], include_stop_str_in_output=True), chat=True)
    assert kept.text == whole.text[: cut + len(stop) + 1]


def test_the_end_of_sequence_id_ends_the_answer_with_no_text():
    c = _plan(_chat(400), chat=True, eos_per_mille=50)
    assert c.ids[-1] == tokens.EOS_ID and c.finish_reason == "stop" and c.stop_reason is None
    assert c.tokens[-1] == ""
    ignored = _plan(_chat(400, ignore_eos=True), chat=True, eos_per_mille=50)
    assert tokens.EOS_ID not in ignored.ids and len(ignored.ids) == 400


def test_a_stop_token_id_ends_the_answer_and_is_reported():
    whole = _plan(_chat(100), chat=True)
    target = whole.ids[30]
    c = _plan(_chat(100, stop_token_ids=[target]), chat=True)
    assert c.ids[-1] == target and (c.finish_reason, c.stop_reason) == ("stop", target)


def _split_char_cut(c) -> int:
    """A cut point whose ids end inside a multi-byte character."""
    for k in range(1, len(c.ids)):
        if tokens.incomplete_tail(tokens.BASE.text_bytes(c.ids[:k])):
            return k
    raise AssertionError("no cut inside a character")


def test_a_continuation_cut_inside_a_character_completes_it_first():
    c = _plan(_chat(200), chat=True)
    k = _split_char_cut(c)
    rest = _plan({"prompt": list(c.prompt_ids) + c.ids[:k], "max_tokens": 200 - k}, chat=False)
    assert rest.ids == c.ids[k:]
    sent = tokens.BASE.decode(c.ids[:k]).rstrip("\ufffd")
    assert sent + rest.text == c.text


def test_the_vllm_quirk_option_re_emits_the_prompt_text_when_it_ends_inside_a_character():
    c = _plan(_chat(200), chat=True)
    k = _split_char_cut(c)
    prompt = list(c.prompt_ids) + c.ids[:k]
    rest = _plan({"prompt": prompt, "max_tokens": 20}, chat=False, reemit_split_prompt=True)
    first = next(t for t in rest.tokens if t)
    assert first.startswith("go" + tokens.BASE.decode(c.ids[:k]).rstrip("\ufffd"))
    # A prompt ending on a whole character is not affected.
    clean = _plan(
        {"prompt": list(c.prompt_ids), "max_tokens": 3}, chat=False, reemit_split_prompt=True
    )
    assert clean.ids == c.ids[:3] and not clean.text.startswith("go")


def test_bad_token_prompts_and_lengths_are_refused():
    with pytest.raises(RequestError, match="out of vocabulary"):
        _plan({"prompt": [5, 10**9], "max_tokens": 2}, chat=False)
    with pytest.raises(RequestError, match="maximum context length is 4096"):
        _plan(_chat(5000), chat=True)


def test_without_max_tokens_a_continuation_ends_where_the_original_would_have():
    whole = _plan({"messages": [{"role": "user", "content": "go"}]}, chat=True)
    assert len(whole.ids) == 16 and whole.finish_reason == "length"
    for k in (1, 9, 15):
        rest = _plan({"prompt": list(whole.prompt_ids) + whole.ids[:k]}, chat=False)
        assert rest.ids == whole.ids[k:] and rest.finish_reason == "length"


def test_a_scripted_reply_continues_from_an_id_prompt_with_the_same_default_bound():
    reply = " ".join(f"w{i}" for i in range(30))
    engine = tokens.Tokenizer(tuple(w if i == 0 else " " + w for i, w in enumerate(reply.split())))

    def plan(payload: dict, chat: bool):
        return plan_completion(
            request_id="chatcmpl-test",
            created=1,
            model="m",
            body=b"{}",
            payload={"model": "m", "return_token_ids": True, **payload},
            chat=chat,
            reply=reply,
            echo=False,
            tokenizer=engine,
        )

    whole = plan({"messages": [{"role": "user", "content": "go"}]}, chat=True)
    assert whole.text == " ".join(reply.split()[:16]) and len(whole.ids) == 16
    rest = plan({"prompt": list(whole.prompt_ids) + whole.ids[:5]}, chat=False)
    assert rest.ids == whole.ids[5:] and rest.finish_reason == "length"
