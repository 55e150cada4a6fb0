"""Generation as a pure function of the context's token ids (`--generate`).

The next id depends only on the ids before it (the prompt's and the answer's alike, with no
boundary between them), so a request whose prompt is `prompt_ids + the first k ids of an
answer`, sent to any engine serving the same model, goes on with ids k+1... of that answer:
a continued stream is byte-identical to an uninterrupted one. Nothing depends on the process.

The answer is made of words (tokens.py's vocabulary plus words with multi-byte characters, which
split into byte tokens): a word is chosen by a hash of the context before it, then spelled out
token by token. The rule that finds where the current word began needs every word to start with
a space piece and no later piece to, which the word list below keeps.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from supervisor.sim import tokens

_MASK = (1 << 64) - 1
_MULTIPLIER = 0x100000001B3  # FNV-1a's 64-bit prime: a cheap, well-spread fold of the ids

# What the model says. The multi-byte words spell out as byte tokens, so cuts land inside
# characters; "." and "," are one-token words without a space.
_SPOKEN_TEXT = (
    "the stream continues on the standby host and every token arrives once . the proxy keeps "
    "the ids , the engine sends the next chunk . café naïve über Zürich München Köln Straße "
    "façade piñata 日本 東京 — ✓ 🙂 smörgåsbord crème brûlée , one two three four five ."
)
_SPOKEN = _SPOKEN_TEXT.split()
WORDS: tuple[tuple[int, ...], ...] = tuple(
    tuple(tokens.BASE.encode(w if w in {".", ","} else " " + w)) for w in _SPOKEN
)
# The longest word in tokens: how far back a word can have begun.
_LONGEST_WORD = max(len(w) for w in WORDS)


def seed(model: str) -> int:
    """The hash every context starts from: per model name, never per process."""
    return int.from_bytes(hashlib.sha256(model.encode()).digest()[:8], "big")


def _fold(h: int, token_id: int) -> int:
    return ((h ^ (token_id + 1)) * _MULTIPLIER) & _MASK


def _mix(h: int) -> int:
    """splitmix64's finaliser: neighbouring hashes choose unrelated words."""
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK
    return h ^ (h >> 31)


class Generator:
    """Produce the ids that follow a context, one at a time.

    `eos_per_mille` is the chance, at each word boundary, that the model ends its answer with
    the end-of-sequence id; 0 (the default) never does, so answers run to `max_tokens`.
    """

    def __init__(
        self,
        tokenizer: tokens.Tokenizer,
        model_seed: int,
        prompt: Iterable[int],
        *,
        eos_per_mille: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.context: list[int] = []
        # hashes[i] is the hash of context[:i]: the choice of a word depends on all before it.
        self.hashes = [model_seed]
        self.eos_per_mille = eos_per_mille
        for token_id in prompt:
            self._append(token_id)

    def _append(self, token_id: int) -> None:
        self.context.append(token_id)
        self.hashes.append(_fold(self.hashes[-1], token_id))

    def next_id(self, *, ignore_eos: bool = False) -> int:
        """Return the id that follows the context, and append it."""
        token_id = self._choose(ignore_eos)
        self._append(token_id)
        return token_id

    def _choose(self, ignore_eos: bool) -> int:
        n = len(self.context)
        for start in range(n - 1, max(-1, n - _LONGEST_WORD - 1), -1):
            if self.tokenizer.piece(self.context[start])[:1] == b" ":
                word = WORDS[_mix(self.hashes[start]) % len(WORDS)]
                done = n - start
                if done < len(word) and tuple(self.context[start:]) == word[:done]:
                    return word[done]  # spell out the rest of the word begun at `start`
                break
        h = _mix(self.hashes[n])
        if not ignore_eos and self.eos_per_mille and (h >> 32) % 1000 < self.eos_per_mille:
            return tokens.EOS_ID
        return WORDS[h % len(WORDS)][0]
