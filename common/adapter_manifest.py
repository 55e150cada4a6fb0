"""The adapter manifest: what a trainer writes to say "this checkpoint is a servable adapter".

A trainer that wants Haru to pick an adapter up writes, inside one checkpoint directory, a
standard peft adapter (`adapter_config.json` and the weights) and, last, `haru-adapter.json`
(MANIFEST_NAME): the completion marker. A directory without it is a checkpoint in progress, a
resume point, or something else; Haru never reads it as an adapter. The trainer contract in
docs/adapters.md says the same in prose.

The manifest names its files with their sha256 and size; the adapter's digest is the sha256 of
those (path, sha256, size) triples in a canonical form (`adapter_digest`), so two stores holding
the same files agree on it, and a file that changed by one bit changes it. Every supervisor that
stores a copy checks each file against the manifest before it says the copy is complete, and
the control plane checks the digest the store reports against the one it registered.

Shared by the supervisor (which imports checkpoints and receives copies), the control plane
(which registers versions) and the trainers (which write it). Standard library only: trainers
run it under whatever Python their command names.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_NAME = "haru-adapter.json"
FORMAT = "haru-adapter/1"
# Bounds: a manifest is read from a directory another process wrote, and sent over the wire.
MAX_MANIFEST_BYTES = 64 * 1024
MAX_FILES = 16
MAX_EVAL = 16
MAX_PROMPT_CHARS = 2_000
MAX_ANSWER_CHARS = 2_000
MAX_EVAL_TOKENS = 256
# A file name inside an adapter directory: no path separators, no dot-names (writes in
# progress), bounded.
_FILE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}\Z")
# An adapter name: what clients send as `model`, lower case like a served model name, and
# never containing "@" (the engine name is NAME@vN, VERSION_SEP).
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}\Z")
_SHA256 = re.compile(r"^[0-9a-f]{64}\Z")
VERSION_SEP = "@v"


class ManifestInvalid(ValueError):
    """A manifest Haru refuses; the message names the field at fault."""


@dataclass(frozen=True)
class AdapterFile:
    path: str
    sha256: str
    bytes: int

    def as_json(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "bytes": self.bytes}


@dataclass(frozen=True)
class EvalAnswer:
    """One evaluation prompt, the trained adapter's greedy answer and the base model's."""

    prompt: str
    max_tokens: int
    answer: str
    base_answer: str

    def as_json(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "maxTokens": self.max_tokens,
            "answer": self.answer,
            "baseAnswer": self.base_answer,
        }


@dataclass(frozen=True)
class Manifest:
    name: str
    base_model: str
    base_model_digest: str
    rank: int
    target_modules: tuple[str, ...]
    files: tuple[AdapterFile, ...]
    eval: tuple[EvalAnswer, ...]
    completed_at: str
    # {steps?: int, loss?: float, checkpoint?: str, ...}: reported, never interpreted.
    training: Mapping[str, Any] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        return adapter_digest(self.files)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def store_id(self) -> str:
        return store_id(self.digest)

    def distinguishable(self) -> bool:
        """Whether any evaluation answer differs from the base model's: an adapter that answers
        exactly like its base cannot be told apart from one that is not applied at all."""
        return any(e.answer != e.base_answer for e in self.eval)

    def as_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "baseModel": self.base_model,
            "baseModelDigest": self.base_model_digest,
            "rank": self.rank,
            "targetModules": list(self.target_modules),
            "files": [f.as_json() for f in self.files],
            "eval": [e.as_json() for e in self.eval],
            "training": dict(self.training),
            "completedAt": self.completed_at,
        }


def adapter_digest(files: Sequence[AdapterFile]) -> str:
    """`sha256:<hex>` over the files' (path, sha256, size), sorted by path."""
    canon = json.dumps(
        [[f.path, f.sha256, f.bytes] for f in sorted(files, key=lambda f: f.path)],
        separators=(",", ":"),
    )
    return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()


def store_id(digest: str) -> str:
    """The directory name a store keeps an adapter under: the digest's first 32 hex digits."""
    return digest.removeprefix("sha256:")[:32]


def engine_name(name: str, version: int) -> str:
    """The concrete name a version is loaded under on the engine: never reused, so a reload
    can never serve stale weights under a name that once meant other ones."""
    return f"{name}{VERSION_SEP}{version}"


def name_valid(name: Any) -> bool:
    return isinstance(name, str) and bool(_NAME.match(name))


def file_sha256(path: Path, chunk: int = 1024 * 1024) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
            size += len(block)
    return h.hexdigest(), size


def _text(raw: Any, where: str, most: int, *, empty: bool = False) -> str:
    if not isinstance(raw, str) or (not raw and not empty) or len(raw) > most:
        raise ManifestInvalid(
            f"{where} must be a {'' if empty else 'non-empty '}string of at most {most} characters"
        )
    return raw


def _int(raw: Any, where: str, low: int, high: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        raise ManifestInvalid(f"{where} must be an integer from {low} to {high}")
    return raw


def manifest_parse(raw: Any) -> Manifest:
    """Read a manifest (already decoded JSON); raise ManifestInvalid naming the field."""
    if not isinstance(raw, Mapping):
        raise ManifestInvalid("the manifest must be an object")
    if raw.get("format") != FORMAT:
        raise ManifestInvalid(f"format must be {FORMAT!r}")
    name = raw.get("name")
    if not isinstance(name, str) or not name_valid(name):
        raise ManifestInvalid(
            "name must be lower case letters, digits, '.', '_' or '-' (at most 100, no '@')"
        )
    base = _text(raw.get("baseModel"), "baseModel", 200)
    base_digest = _text(raw.get("baseModelDigest"), "baseModelDigest", 80)
    rank = _int(raw.get("rank"), "rank", 1, 1024)
    modules = raw.get("targetModules")
    if not isinstance(modules, list) or not 1 <= len(modules) <= 64:
        raise ManifestInvalid("targetModules must be a list of 1 to 64 module names")
    targets = tuple(_text(m, "targetModules[]", 100) for m in modules)
    raw_files = raw.get("files")
    if not isinstance(raw_files, list) or not 1 <= len(raw_files) <= MAX_FILES:
        raise ManifestInvalid(f"files must list 1 to {MAX_FILES} files")
    files: list[AdapterFile] = []
    for i, item in enumerate(raw_files):
        if not isinstance(item, Mapping):
            raise ManifestInvalid(f"files[{i}] must be an object")
        path = item.get("path")
        if not isinstance(path, str) or not _FILE.match(path) or path == MANIFEST_NAME:
            raise ManifestInvalid(f"files[{i}].path must be a plain file name")
        sha = item.get("sha256")
        if not isinstance(sha, str) or not _SHA256.match(sha):
            raise ManifestInvalid(f"files[{i}].sha256 must be 64 lower-case hex digits")
        files.append(AdapterFile(path, sha, _int(item.get("bytes"), f"files[{i}].bytes", 0, 2**40)))
    if len({f.path for f in files}) != len(files):
        raise ManifestInvalid("files must not name a path twice")
    if "adapter_config.json" not in {f.path for f in files}:
        raise ManifestInvalid("files must include adapter_config.json (a peft adapter)")
    raw_eval = raw.get("eval")
    if not isinstance(raw_eval, list) or not 1 <= len(raw_eval) <= MAX_EVAL:
        raise ManifestInvalid(f"eval must list 1 to {MAX_EVAL} prompts with their answers")
    evals: list[EvalAnswer] = []
    for i, item in enumerate(raw_eval):
        if not isinstance(item, Mapping):
            raise ManifestInvalid(f"eval[{i}] must be an object")
        evals.append(
            EvalAnswer(
                prompt=_text(item.get("prompt"), f"eval[{i}].prompt", MAX_PROMPT_CHARS),
                max_tokens=_int(item.get("maxTokens"), f"eval[{i}].maxTokens", 1, MAX_EVAL_TOKENS),
                answer=_text(item.get("answer"), f"eval[{i}].answer", MAX_ANSWER_CHARS, empty=True),
                base_answer=_text(
                    item.get("baseAnswer"), f"eval[{i}].baseAnswer", MAX_ANSWER_CHARS, empty=True
                ),
            )
        )
    training = raw.get("training", {})
    if not isinstance(training, Mapping):
        raise ManifestInvalid("training must be an object")
    completed = _text(raw.get("completedAt"), "completedAt", 40)
    return Manifest(
        name=name,
        base_model=base,
        base_model_digest=base_digest,
        rank=rank,
        target_modules=targets,
        files=tuple(files),
        eval=tuple(evals),
        completed_at=completed,
        training=dict(training),
    )


def manifest_read(directory: Path) -> Manifest:
    """Read and parse `directory/haru-adapter.json`; raise ManifestInvalid or OSError."""
    path = directory / MANIFEST_NAME
    with open(path, "rb") as f:
        data = f.read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestInvalid(f"{MANIFEST_NAME} is over {MAX_MANIFEST_BYTES} bytes")
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise ManifestInvalid(f"{MANIFEST_NAME} is not JSON: {exc}") from None
    return manifest_parse(raw)


def files_verify(directory: Path, manifest: Manifest) -> str | None:
    """Check every file the manifest names against its size and sha256; the first mismatch
    as a sentence, or None when all match."""
    for f in manifest.files:
        try:
            sha, size = file_sha256(directory / f.path)
        except OSError as exc:
            return f"{f.path}: {exc.strerror or exc}"
        if size != f.bytes:
            return f"{f.path}: {size} bytes, the manifest says {f.bytes}"
        if sha != f.sha256:
            return f"{f.path}: sha256 {sha[:12]}…, the manifest says {f.sha256[:12]}…"
    return None


def manifest_write(directory: Path, manifest: Manifest) -> Path:
    """Write the manifest last and atomically (the completion marker): write, fsync, rename."""
    import os  # noqa: PLC0415 - only writers need it

    target = directory / MANIFEST_NAME
    tmp = directory / f".{MANIFEST_NAME}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(manifest.as_json(), f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    return target


def manifest_for(
    directory: Path,
    *,
    name: str,
    base_model: str,
    base_model_digest: str,
    rank: int,
    target_modules: Sequence[str],
    eval_answers: Sequence[EvalAnswer],
    completed_at: str,
    training: Mapping[str, Any] | None = None,
) -> Manifest:
    """Build the manifest of the adapter files already written in `directory` (every plain
    file but the manifest itself), hashing each."""
    files = []
    for entry in sorted(directory.iterdir()):
        if entry.is_file() and _FILE.match(entry.name) and entry.name != MANIFEST_NAME:
            sha, size = file_sha256(entry)
            files.append(AdapterFile(entry.name, sha, size))
    return manifest_parse(
        {
            "format": FORMAT,
            "name": name,
            "baseModel": base_model,
            "baseModelDigest": base_model_digest,
            "rank": rank,
            "targetModules": list(target_modules),
            "files": [f.as_json() for f in files],
            "eval": [e.as_json() for e in eval_answers],
            "training": dict(training or {}),
            "completedAt": completed_at,
        }
    )
