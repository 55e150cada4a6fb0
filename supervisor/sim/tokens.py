"""The simulated engine's own tokenizer: fixed, byte-level, exactly reversible.

Ids 0..4 are special tokens (end of sequence and the chat template's markers), ids 5..260 are
the 256 single bytes, and the rest are whole words and word pieces. Encoding is a greedy
longest match within each word, so any text encodes (a byte always matches) and decoding the
ids gives the exact bytes back. Multi-byte characters outside the vocabulary (`é`, `日`, `🙂`)
fall back to one token per byte: a stream cut between two such tokens is cut inside a
character, as a real byte-level BPE stream can be, which is what the proxy's rebuild-from-ids
must survive.

Nothing here depends on the process: two engines agree on every id.
"""

from __future__ import annotations

import re
from typing import Any

EOS_ID = 0
SPECIALS = ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
ROLE_IDS = {"system": 1, "user": 2, "assistant": 3}
END_ID = 4
BYTE_BASE = len(SPECIALS)

# Words the generator speaks (generate.py) and that common prompts use: whole tokens with and
# without a leading space, and pieces of the multi-byte words, so those split into pieces and
# bytes. Appending keeps every existing id; reordering would change them (and every answer).
_WORDS_TEXT = (
    "the a an and or of to in on at for with from by as is are was be it this that "
    "stream streams token tokens answer answers model models server servers host hosts "
    "standby active domain domains failover proxy engine engines request requests reply "
    "simulated seam cut continue continues continued byte bytes text chunk chunks every "
    "one two three four five six seven eight nine ten hello there ping test world "
    "keeps holds moves sends reads writes waits wakes sleeps probes routes serves "
    "quick slow long short warm cold same other next last first new old "
    "caf na ve ber Z rich M nchen K ln Stra fa ade pi ata gr"
)
_WORDS = _WORDS_TEXT.split()
_PUNCTUATION = (".", ",", ";", ":", "!", "?", "\n", "\n\n", "-")
# Encoding works a segment at a time: a word with the one space before it, or a run of spaces.
_SEGMENT = re.compile(rb" ?[^\s]+|\s+")
SEGMENT_CACHE_SIZE = 65536
BASE_VOCAB: tuple[bytes, ...] = (
    tuple(s.encode() for s in SPECIALS)
    + tuple(bytes([b]) for b in range(256))
    + tuple(w.encode() for w in _WORDS)
    + tuple((" " + w).encode() for w in _WORDS)
    + tuple(p.encode() for p in _PUNCTUATION if len(p.encode()) > 1)
)


class Tokenizer:
    """The base vocabulary, plus whole words an engine adds after it (the words of its
    scripted reply, so each scripted word is one token, as each was one before ids existed).
    The base ids never move: what generate.py emits means the same to every engine."""

    def __init__(self, extra_words: tuple[str, ...] = ()) -> None:
        known = set(BASE_VOCAB)
        added = []
        for word in extra_words:
            piece = word.encode()
            if piece and piece not in known:
                known.add(piece)
                added.append(piece)
        self.vocab: tuple[bytes, ...] = BASE_VOCAB + tuple(added)
        self._ids = {piece: i for i, piece in enumerate(self.vocab) if i >= BYTE_BASE}
        # The vocabulary with special tokens as no bytes: what `text_bytes` joins by default.
        self._spoken = (b"",) * BYTE_BASE + self.vocab[BYTE_BASE:]
        self._longest = max(len(piece) for piece in self.vocab[BYTE_BASE:])
        self._segments: dict[bytes, tuple[int, ...]] = {}

    @property
    def size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        """Return the ids of `text`: a word (with the space before it) or a run of spaces at a
        time, each by greedy longest match, a byte token when nothing longer fits."""
        ids: list[int] = []
        for segment in _SEGMENT.findall(text.encode()):
            found = self._segments.get(segment)
            if found is None:
                found = self._longest_matches(segment)
                # Words repeat: remembered, up to a bound so that no prompt grows it forever.
                if len(self._segments) < SEGMENT_CACHE_SIZE:
                    self._segments[segment] = found
            ids.extend(found)
        return ids

    def _longest_matches(self, data: bytes) -> tuple[int, ...]:
        ids: list[int] = []
        i = 0
        while i < len(data):
            for size in range(min(self._longest, len(data) - i), 0, -1):
                found = self._ids.get(data[i : i + size])
                if found is not None:
                    ids.append(found)
                    i += size
                    break
        return tuple(ids)

    def piece(self, token_id: int) -> bytes:
        """Return the bytes one id stands for (a special token's are its marker text)."""
        return self.vocab[token_id]

    def out_of_vocabulary(self, ids: list[Any]) -> Any | None:
        """Return the first entry that is not a valid id, or None when all are."""
        for token_id in ids:
            if type(token_id) is not int or not 0 <= token_id < len(self.vocab):
                return token_id
        return None

    def decode(self, ids: list[int] | tuple[int, ...], *, skip_special: bool = False) -> str:
        """Return the text of `ids`; an incomplete character reads as U+FFFD, as HF's decode."""
        return self.text_bytes(ids, skip_special=skip_special).decode("utf-8", errors="replace")

    def text_bytes(self, ids: list[int] | tuple[int, ...], *, skip_special: bool = True) -> bytes:
        # A lookup per id in C (a continuation's prompt is the whole answer so far).
        return b"".join(map((self._spoken if skip_special else self.vocab).__getitem__, ids))

    def render_chat(self, messages: list[Any], *, add_generation_prompt: bool = True) -> list[int]:
        """Return the prompt ids of a chat: each message between its role marker and `<|end|>`,
        then the assistant's marker (the generation prompt)."""
        ids: list[int] = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            ids.append(ROLE_IDS.get(str(message.get("role")), ROLE_IDS["user"]))
            ids.extend(self.encode(message_text(message.get("content"))))
            ids.append(END_ID)
        if add_generation_prompt:
            ids.append(ROLE_IDS["assistant"])
        return ids


BASE = Tokenizer()


def is_special(token_id: int) -> bool:
    return token_id < BYTE_BASE


def message_text(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def incomplete_tail(data: bytes) -> int:
    """Return how many bytes at the end of `data` begin a character not yet complete."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for the lead
        if byte >= 0xC0:
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return back if back < need else 0
        return 0
    return 0


class IncrementalDecoder:
    """Turn ids into text deltas as vLLM's incremental detokenizer does: bytes of a character
    not yet complete are held back until the token that completes it arrives."""

    def __init__(self, tokenizer: Tokenizer, pending: bytes = b"") -> None:
        self._tokenizer = tokenizer
        self._pending = pending

    def push(self, token_id: int) -> str:
        """Add one generated id; return the text it completes (special tokens give none)."""
        if is_special(token_id):
            return ""
        self._pending += self._tokenizer.piece(token_id)
        keep = incomplete_tail(self._pending)
        ready = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(self._pending) - keep :]
        return ready.decode("utf-8", errors="replace")
