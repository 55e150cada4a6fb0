"""The adapter registry's rules: the states of a version and of its copies on each domain.

A trainer's completed checkpoint (common/adapter_manifest) becomes an adapter version once the
control plane registers it (`fleets.services.adapters`): a version number per fleet and adapter
name, counted up and never reused, and an immutable record of its digest, size, files, training
facts and the evaluation answers the trainer recorded. Each domain that may serve it holds a
copy, moved through these states by the reconciler (fleets/reconciler/adapters.py):

    absent -> transferring -> stored -> loaded -> probed
                  |             |         |
                  +-> failed <--+---------+      (a digest mismatch, a refused load, a probe
                                                  that answered wrong: the copy's `why`)
    stored | loaded | probed -> removed          (retention, or unloaded and deleted)

`probed` is the only state the proxy may route to: a load the engine reported as done proves
nothing until the adapter answered its golden prompts (the first time, the trainer's recorded
answers; after that, its own baseline).

Pure: no ORM, no clock of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from common.adapter_manifest import EvalAnswer, Manifest


class AdapterVersionState(StrEnum):
    # Registered from a trainer's manifest; its copies move on their own.
    REGISTERED = "registered"
    # Refused at registration: a base model the fleet does not serve, an adapter that answers
    # exactly like its base (nothing could prove it is applied), a manifest another store
    # reported with other files under the same digest.
    REJECTED = "rejected"
    # Retention removed its files everywhere; the row stays so its number is never reused.
    RETIRED = "retired"


class CopyState(StrEnum):
    ABSENT = "absent"
    TRANSFERRING = "transferring"
    STORED = "stored"
    LOADED = "loaded"
    PROBED = "probed"
    FAILED = "failed"
    REMOVED = "removed"


# A copy the engine holds (a load was acknowledged); only PROBED is routable.
LOADED_STATES = frozenset({CopyState.LOADED, CopyState.PROBED})
# A copy whose files are complete and checked in the domain's store.
STORED_STATES = frozenset({CopyState.STORED, CopyState.LOADED, CopyState.PROBED})


# -- the registry's rules (appended: the enums above are shared and never change values) -------

# How many registered versions of each adapter name are kept on top of the routed ones (the
# policy's `adapterKeepVersions` default): a rollback target, the previous version, a few more.
DEFAULT_KEEP_VERSIONS = 5
# A copy whose transfer (a digest mismatch) or probe failed is retried this many times, each
# after twice the wait of the one before; then it stays failed until an operator looks.
MAX_COPY_ATTEMPTS = 5
COPY_RETRY_BASE_MS = 30_000


def versions_kept(
    registered: Mapping[str, Sequence[int]], routed: Mapping[str, Sequence[int]], keep: int
) -> dict[str, frozenset[int]]:
    """Per adapter name, the registered versions retention keeps: every version a route names
    (version and candidate) and the newest `keep`. A routed version is kept whatever its age:
    the rollout keeps the previous version routed until its candidate took everything."""
    out: dict[str, frozenset[int]] = {}
    for name, versions in registered.items():
        newest = sorted(versions, reverse=True)[: max(0, keep)]
        out[name] = frozenset(newest) | frozenset(v for v in routed.get(name, ()) if v in versions)
    return out


def distinguishing(evals: Sequence[EvalAnswer]) -> list[EvalAnswer]:
    """The evaluation prompts whose trained answer differs from the base model's: the ones
    whose answer proves the adapter is applied."""
    return [e for e in evals if e.answer != e.base_answer]


def probe_failure(
    evals: Sequence[EvalAnswer],
    answers: Mapping[str, str | None],
    baseline: Mapping[str, str],
) -> str | None:
    """Judge a loaded copy's answers to its evaluation prompts (prompt -> answer; None: no
    answer); None when it passes, else why, naming the prompt.

    Without a baseline (the copy's first probe) each answer must be the trainer's recorded
    `answer` exactly, never the copy's own earlier answer; an answer equal to `baseAnswer`
    where the manifest says the two differ means the engine loaded the adapter and serves the
    base model through it. With a baseline, each answer must equal the baseline's.
    """
    for e in evals:
        got = answers.get(e.prompt)
        short = e.prompt[:40]
        if got is None:
            return f"no answer to eval prompt {short!r}"
        if baseline:
            want = baseline.get(e.prompt)
            if want is not None and got != want:
                return f"answer to {short!r} differs from this copy's baseline"
            continue
        if got == e.answer:
            continue
        if got == e.base_answer and e.answer != e.base_answer:
            return f"loaded but serving nothing: {short!r} answered exactly like the base model"
        return f"answer to {short!r} differs from the trainer's recorded answer"
    return None


def retry_due(attempts: int, failed_ms_ago: int) -> bool:
    """Whether a failed copy is tried again: fewer than MAX_COPY_ATTEMPTS failures, and the
    doubling wait after the last one has passed."""
    if attempts >= MAX_COPY_ATTEMPTS:
        return False
    wait_ms: int = COPY_RETRY_BASE_MS * 2 ** max(0, attempts - 1)
    return failed_ms_ago >= wait_ms


@dataclass(frozen=True)
class Chunk:
    """The next piece of a transfer: file `path` from byte `offset` (what the target holds)."""

    path: str
    offset: int
    size: int  # the file's full size


def transfer_next(manifest: Manifest, incoming: Mapping[str, int]) -> Chunk | None:
    """The first file the target does not hold in full, from what it holds (its incoming
    sizes are the truth: a transfer resumes there, whichever process sent the bytes before);
    None when every file is complete (commit next). A file the target holds more of than the
    manifest says cannot be repaired by appending: raise ValueError."""
    for f in sorted(manifest.files, key=lambda f: f.path):
        have = int(incoming.get(f.path, 0))
        if have > f.bytes:
            raise ValueError(f"{f.path}: the target holds {have} bytes of {f.bytes}")
        if have < f.bytes:
            return Chunk(f.path, have, f.bytes)
    return None
