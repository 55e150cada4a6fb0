"""Golden probes: does a woken model still answer what it answered when it was known good?

A golden probe is greedy (temperature 0) and seeded, with the fleet's probe prompt and a few
tokens, so a healthy engine answers the same every time; even random weights do. The answer a
model gave when it was known good (the first serving of its profile, or an operator's "record
baseline") is its fingerprint. After every wake, before routing moves, the probe must give it
again: an engine that woke with its LoRA adapter no longer applied, or with corrupted weights,
answers something else with no error at all.

Pure: the caller brings the probe's results and the recorded baselines, and acts on the verdicts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from fleets.core.states import OperationErrorCode

# Fixed, so every probe of every fleet asks the same question the same way.
GOLDEN_SEED = 1_337
# An operation fails with this code when a woken model answers differently.
PROBE_MISMATCH = OperationErrorCode.PROBE_MISMATCH
# How much of an answer a message or event quotes: enough to see the difference.
QUOTE_CHARS = 120


class Verdict(StrEnum):
    MATCH = "match"  # reproduced the baseline
    MISMATCH = "mismatch"  # answered something else: the promotion must fail
    UNRECORDED = "unrecorded"  # no baseline for this key yet: this answer becomes it
    ANSWERED = "answered"  # not comparable (non-deterministic engine, or a plain probe)
    FAILED = "failed"  # no usable answer at all


class BaselineReason(StrEnum):
    """Why a baseline was recorded (GoldenBaseline.reason, and the event's)."""

    FIRST_SERVING = "first_serving"  # no baseline for this profile and engine yet
    ACTIVE_SERVING = "active_serving"  # the tick probed the serving active for a missing key
    OPERATOR = "operator"  # "record baseline": an expected drift (an engine upgrade) accepted


@dataclass(frozen=True)
class GoldenKey:
    """What a baseline is kept per: a changed profile, engine or probe changes the answer."""

    model: str
    adapter: str  # "" for the base model
    profile_fingerprint: str
    engine_version: str  # "" when the engine does not say
    request_fingerprint: str

    @property
    def label(self) -> str:
        return target_label(self.model, self.adapter)


@dataclass(frozen=True)
class ProbeAnswer:
    """One probe result as read from the supervisor's `POST /v1/probe` answer (the reconciler's
    report reader builds it; the judge and the promotion read it)."""

    model: str
    adapter: str  # "" for the base model
    ok: bool
    error: str | None = None
    # Golden probes (feature probe.golden): the answer text and the engine's version.
    answer: str | None = None
    engine_version: str | None = None
    latency_ms: int | None = None


@dataclass(frozen=True)
class Recorded:
    """A baseline as the judge needs it: the answer's digest, and the answer to quote."""

    answer_sha256: str
    answer: str


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    key: GoldenKey | None
    message: str = ""
    expected: str | None = None
    got: str | None = None

    @property
    def passed(self) -> bool:
        return self.verdict not in (Verdict.MISMATCH, Verdict.FAILED)


def target_label(model: str, adapter: str) -> str:
    """Name a probe target the way messages and the dashboard show it."""
    return f"{model} (adapter {adapter})" if adapter else model


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def profile_fingerprint(profile: Mapping[str, Any]) -> str:
    """Fingerprint a binding's engine profile as the layout states it."""
    return _digest(dict(profile))


def request_fingerprint(prompt: str, max_tokens: int, seed: int = GOLDEN_SEED) -> str:
    """Fingerprint the probe request: another prompt or length is another question."""
    return _digest({"prompt": prompt, "maxTokens": max_tokens, "seed": seed})


def answer_sha256(answer: str) -> str:
    return hashlib.sha256(answer.encode()).hexdigest()


def quote(text: str | None) -> str:
    if text is None:
        return "(nothing)"
    return json.dumps(text[:QUOTE_CHARS] + ("…" if len(text) > QUOTE_CHARS else ""))


def baseline_missing(
    recorded: Collection[tuple[str, str, str, str]],
    *,
    model: str,
    adapter: str,
    profile: Mapping[str, Any],
    engine_version: str,
) -> bool:
    """Whether a target has no baseline to be judged against yet.

    `recorded` holds (model, adapter, profile fingerprint, engine version) of the fleet's
    baselines for the probe request. `engine_version` is what the target's server last
    reported (""; never reported): a version with no baseline of its own is missing, since
    its first wake would otherwise become its own baseline, unjudged; with no version known,
    a baseline at any version counts, as nothing better is known.
    """
    fp = profile_fingerprint(profile)
    if engine_version:
        return (model, adapter, fp, engine_version) not in recorded
    return not any(r[:3] == (model, adapter, fp) for r in recorded)


def key_for(answer: ProbeAnswer, *, profile: Mapping[str, Any], request: str) -> GoldenKey:
    return GoldenKey(
        model=answer.model,
        adapter=answer.adapter,
        profile_fingerprint=profile_fingerprint(profile),
        engine_version=answer.engine_version or "",
        request_fingerprint=request,
    )


def judge(
    answer: ProbeAnswer | None,
    *,
    model: str,
    adapter: str,
    profile: Mapping[str, Any],
    request: str,
    deterministic: bool,
    golden: bool,
    baselines: Mapping[GoldenKey, Recorded],
) -> Judgement:
    """Judge one probe target against the recorded baselines.

    `golden` says whether the probe was asked greedy and seeded (a supervisor without the
    feature answers a plain probe); `deterministic` is the layout's word on the engine. Either
    false falls back to "answers, non-empty, within budget", which the supervisor already
    enforces (an empty reply or a timeout is a failed result).
    """
    label = target_label(model, adapter)
    if answer is None:
        return Judgement(Verdict.FAILED, None, f"{label}: not probed")
    if not answer.ok:
        return Judgement(Verdict.FAILED, None, f"{label}: {answer.error or 'failed'}")
    if not (golden and deterministic) or answer.answer is None:
        return Judgement(Verdict.ANSWERED, None)
    key = key_for(answer, profile=profile, request=request)
    recorded = baselines.get(key)
    if recorded is None:
        return Judgement(Verdict.UNRECORDED, key, got=answer.answer)
    if recorded.answer_sha256 == answer_sha256(answer.answer):
        return Judgement(Verdict.MATCH, key)
    return Judgement(
        Verdict.MISMATCH,
        key,
        f"{label}: expected {quote(recorded.answer)}, got {quote(answer.answer)}",
        expected=recorded.answer,
        got=answer.answer,
    )
