"""Rollouts through the standby: the states, the plan an operator asks for, the gates, the checks.

A rollout moves one served model of a fleet to a new version (a profile: new weights, a new
engine release, a quantization, changed flags) by way of the standby. Its arms are the stable
(the active domain, as the routing pointer names it) and the candidate (the standby, swapped to
the new profile). The reconciler (fleets/reconciler/rollout.py) drives it through these states:

    pending -> preparing   (stop the standby's trainer, swap the model to the new profile)
            -> checking    (answer checks; a candidate that fails never gets a user request)
            -> stepping    (the split's weight moves step by step, gates read at each)
            -> promoting   (at 100 %: a planned promotion of the standby)
            -> finishing   (the old active, now the standby, swapped to the new version)
            -> succeeded
    any in flight -> paused (operator, or a failover)   -> back where it was (resume)
    any in flight -> rolling_back (a gate failed, the standby failed, the operator aborted)
                  -> rolled_back | aborted
    any in flight -> failed (a fault that leaves nothing to restore: the swap was refused)

Pure: no ORM, no clock of its own; the services and the reconciler supply the facts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from fleets.core.arm_stats import Arm, ArmWindow
from fleets.core.route_split import _HEADER as STICKY_HEADER_RE


class RolloutState(StrEnum):
    PENDING = "pending"
    PREPARING = "preparing"
    CHECKING = "checking"
    STEPPING = "stepping"
    PROMOTING = "promoting"
    FINISHING = "finishing"
    PAUSED = "paused"
    ROLLING_BACK = "rolling_back"
    SUCCEEDED = "succeeded"
    ROLLED_BACK = "rolled_back"
    ABORTED = "aborted"
    FAILED = "failed"


R = RolloutState

# In flight: at most one per fleet (a partial unique index), and it holds the standby.
IN_FLIGHT_ROLLOUT_STATES = frozenset(
    {
        R.PENDING,
        R.PREPARING,
        R.CHECKING,
        R.STEPPING,
        R.PROMOTING,
        R.FINISHING,
        R.PAUSED,
        R.ROLLING_BACK,
    }
)
FINAL_ROLLOUT_STATES = frozenset({R.SUCCEEDED, R.ROLLED_BACK, R.ABORTED, R.FAILED})
# Where a pause may come from, and so where a resume goes back to.
PAUSABLE = frozenset({R.PREPARING, R.CHECKING, R.STEPPING, R.PROMOTING})

ROLLOUT_TRANSITIONS: Mapping[RolloutState, frozenset[RolloutState]] = {
    R.PENDING: frozenset({R.PREPARING, R.ROLLING_BACK, R.FAILED, R.ABORTED}),
    R.PREPARING: frozenset({R.CHECKING, R.PAUSED, R.ROLLING_BACK, R.FAILED}),
    R.CHECKING: frozenset({R.STEPPING, R.PROMOTING, R.PAUSED, R.ROLLING_BACK}),
    R.STEPPING: frozenset({R.STEPPING, R.PROMOTING, R.PAUSED, R.ROLLING_BACK}),
    R.PROMOTING: frozenset({R.FINISHING, R.PAUSED, R.ROLLING_BACK}),
    R.FINISHING: frozenset({R.SUCCEEDED, R.FAILED}),
    R.PAUSED: frozenset(
        {R.PREPARING, R.CHECKING, R.STEPPING, R.PROMOTING, R.FINISHING, R.ROLLING_BACK, R.ABORTED}
    ),
    R.ROLLING_BACK: frozenset({R.ROLLED_BACK, R.ABORTED, R.FAILED}),
    R.SUCCEEDED: frozenset(),
    R.ROLLED_BACK: frozenset(),
    R.ABORTED: frozenset(),
    R.FAILED: frozenset(),
}


class RolloutTransitionRefused(ValueError):
    """A (from, to) pair the state table does not allow."""


def check_rollout_transition(from_state: str, to_state: str) -> None:
    allowed = ROLLOUT_TRANSITIONS.get(RolloutState(from_state), frozenset())
    if RolloutState(to_state) not in allowed:
        raise RolloutTransitionRefused(f"rollout cannot move from {from_state} to {to_state}")


class CandidateKind(StrEnum):
    # The answers must not change (an engine upgrade on the same weights, a new flag): the
    # candidate's answers are compared with the stable arm's, never with its own.
    SAME_WEIGHTS = "same-weights"
    # New weights: the operator writes what each answer must contain.
    NEW_WEIGHTS = "new-weights"


class SwapMode(StrEnum):
    NEW_PORT = "new-port"
    IN_PLACE = "in-place"


class GateVerdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    WAIT = "wait"  # not enough samples yet on one arm


# Bounds: every edge of a rollout request is bounded.
MAX_STEPS = 10
MIN_DWELL_S = 5
MAX_DWELL_S = 7 * 24 * 3600
MAX_CHECKS = 16
MAX_PROMPT_CHARS = 4096
MAX_EXPECT_CHARS = 1024
MAX_CHECK_TOKENS = 1024
MAX_PROFILE_KEYS = 64
# The supervisor's swap refuses a profile larger than this (docs/supervisor.md).
MAX_PROFILE_BYTES = 16 * 1024
MAX_WINDOW_S = 3600
MIN_WINDOW_S = 5
MAX_MIN_SAMPLES = 1_000_000
MAX_REASON_CHARS = 500

DEFAULT_STEPS = ({"weight": 1, "dwellS": 300}, {"weight": 5, "dwellS": 300},
                 {"weight": 25, "dwellS": 600}, {"weight": 50, "dwellS": 600},
                 {"weight": 100, "dwellS": 0})  # fmt: skip
DEFAULT_GATES = {
    "maxErrorRateDelta": 0.01,
    "ttftP95Ratio": 1.5,
    "itlP95Ratio": 1.5,
    "minSamples": 50,
    "windowS": 120,
}


class RolloutInvalid(ValueError):
    """A rollout request the control plane refuses; `field` names the part at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Step:
    weight: int  # percent of the model's traffic to the candidate, 1..100
    dwell_s: int  # how long the weight holds (gates passing) before the next step

    def as_json(self) -> dict[str, Any]:
        return {"weight": self.weight, "dwellS": self.dwell_s}


@dataclass(frozen=True)
class Gates:
    max_error_rate_delta: float  # candidate's error rate minus the stable arm's, at most
    ttft_p95_ratio: float  # candidate's p95 time to first token over the stable arm's, at most
    itl_p95_ratio: float  # the same for inter-token latency (judged only where both stream)
    min_samples: int  # requests (and latency samples) each arm needs before a verdict
    window_s: int  # the window the arms are compared over (never before the step began)

    def as_json(self) -> dict[str, Any]:
        return {
            "maxErrorRateDelta": self.max_error_rate_delta,
            "ttftP95Ratio": self.ttft_p95_ratio,
            "itlP95Ratio": self.itl_p95_ratio,
            "minSamples": self.min_samples,
            "windowS": self.window_s,
        }


class MatchKind(StrEnum):
    SUBSTRING = "substring"
    REGEX = "regex"


@dataclass(frozen=True)
class AnswerCheck:
    prompt: str
    expect: str = ""  # new weights: what the answer must contain (substring or regex)
    match: MatchKind = MatchKind.SUBSTRING
    max_tokens: int = 32

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"prompt": self.prompt, "maxTokens": self.max_tokens}
        if self.expect:
            out["expect"] = self.expect
            out["match"] = self.match.value
        return out


@dataclass(frozen=True)
class Candidate:
    kind: CandidateKind
    profile: dict[str, Any]  # the new profile, as the supervisor's swap takes it
    checks: tuple[AnswerCheck, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "profile": self.profile,
            "checks": [c.as_json() for c in self.checks],
        }


@dataclass(frozen=True)
class RolloutPlan:
    """A checked rollout request: what the service stores."""

    model: str
    candidate: Candidate
    swap_mode: SwapMode
    steps: tuple[Step, ...]
    gates: Gates
    sticky_header: str = ""
    reason: str = ""


def _number(raw: Any, field: str, *, low: float, high: float, integer: bool = False) -> Any:
    ok_type = isinstance(raw, int) if integer else isinstance(raw, (int, float))
    if isinstance(raw, bool) or not ok_type:
        kind = "an integer" if integer else "a number"
        raise RolloutInvalid(field, f"must be {kind} from {low:g} to {high:g}")
    if not low <= raw <= high:
        raise RolloutInvalid(field, f"must be from {low:g} to {high:g}, got {raw}")
    return raw


def _object(raw: Any, field: str, known: set[str]) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise RolloutInvalid(field, "must be an object")
    unknown = sorted(set(raw) - known)
    if unknown:
        raise RolloutInvalid(
            f"{field}.{unknown[0]}" if field else unknown[0], "is not a known field"
        )
    return raw


def steps_parse(raw: Any) -> tuple[Step, ...]:
    """The weight steps: strictly increasing percents from 1 to 100, the last 100, each with a
    dwell from MIN_DWELL_S to MAX_DWELL_S (the last one's dwell is not waited: it promotes)."""
    if not isinstance(raw, list) or not raw:
        raise RolloutInvalid("steps", "must be a non-empty list of {weight, dwellS}")
    if len(raw) > MAX_STEPS:
        raise RolloutInvalid("steps", f"at most {MAX_STEPS} steps")
    out: list[Step] = []
    for i, item in enumerate(raw):
        where = f"steps[{i}]"
        body = _object(item, where, {"weight", "dwellS"})
        weight = _number(body.get("weight"), f"{where}.weight", low=1, high=100, integer=True)
        last = i == len(raw) - 1
        dwell_raw = body.get("dwellS", 0 if last else None)
        dwell = _number(
            dwell_raw, f"{where}.dwellS", low=0 if last else MIN_DWELL_S, high=MAX_DWELL_S,
            integer=True,
        )  # fmt: skip
        if out and weight <= out[-1].weight:
            raise RolloutInvalid(f"{where}.weight", "weights must be strictly increasing")
        out.append(Step(weight, dwell))
    if out[-1].weight != 100:
        raise RolloutInvalid(f"steps[{len(out) - 1}].weight", "the last step must be 100")
    return tuple(out)


def gates_parse(raw: Any) -> Gates:
    body = dict(DEFAULT_GATES)
    if raw is not None:
        body.update(_object(raw, "gates", set(DEFAULT_GATES)))
    return Gates(
        max_error_rate_delta=float(
            _number(body["maxErrorRateDelta"], "gates.maxErrorRateDelta", low=0, high=1)
        ),
        ttft_p95_ratio=float(_number(body["ttftP95Ratio"], "gates.ttftP95Ratio", low=1, high=100)),
        itl_p95_ratio=float(_number(body["itlP95Ratio"], "gates.itlP95Ratio", low=1, high=100)),
        min_samples=_number(
            body["minSamples"], "gates.minSamples", low=1, high=MAX_MIN_SAMPLES, integer=True
        ),
        window_s=_number(
            body["windowS"], "gates.windowS", low=MIN_WINDOW_S, high=MAX_WINDOW_S, integer=True
        ),
    )


def _text(raw: Any, field: str, most: int, *, empty: bool = False) -> str:
    if not isinstance(raw, str) or (not raw and not empty):
        raise RolloutInvalid(field, "must be a non-empty string")
    if len(raw) > most:
        raise RolloutInvalid(field, f"at most {most} characters")
    return raw


def checks_parse(raw: Any, kind: CandidateKind) -> tuple[AnswerCheck, ...]:
    """Answer checks. New weights need at least one, each with `expect`; same weights compare
    with the stable arm, so `expect` is optional there (the prompts alone are the checks)."""
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise RolloutInvalid("candidate.checks", "must be a list")
    if len(raw) > MAX_CHECKS:
        raise RolloutInvalid("candidate.checks", f"at most {MAX_CHECKS} checks")
    if kind == CandidateKind.NEW_WEIGHTS and not raw:
        raise RolloutInvalid(
            "candidate.checks", "new weights need at least one answer check (prompt, expect)"
        )
    out = []
    for i, item in enumerate(raw):
        where = f"candidate.checks[{i}]"
        body = _object(item, where, {"prompt", "expect", "match", "maxTokens"})
        prompt = _text(body.get("prompt"), f"{where}.prompt", MAX_PROMPT_CHARS)
        expect = body.get("expect", "")
        if kind == CandidateKind.NEW_WEIGHTS or expect:
            expect = _text(expect, f"{where}.expect", MAX_EXPECT_CHARS)
        match = body.get("match", MatchKind.SUBSTRING.value)
        if match not in MatchKind.__members__.values():
            raise RolloutInvalid(f"{where}.match", 'must be "substring" or "regex"')
        if match == MatchKind.REGEX:
            try:
                re.compile(expect)
            except re.error as exc:
                raise RolloutInvalid(
                    f"{where}.expect", f"not a regular expression: {exc}"
                ) from None
        tokens = _number(
            body.get("maxTokens", 32), f"{where}.maxTokens", low=1, high=MAX_CHECK_TOKENS,
            integer=True,
        )  # fmt: skip
        out.append(AnswerCheck(prompt, expect, MatchKind(match), tokens))
    return tuple(out)


def candidate_parse(raw: Any) -> Candidate:
    body = _object(raw, "candidate", {"kind", "profile", "checks"})
    kind = body.get("kind")
    if not isinstance(kind, str) or kind not in CandidateKind.__members__.values():
        raise RolloutInvalid("candidate.kind", 'must be "same-weights" or "new-weights"')
    profile = body.get("profile")
    if not isinstance(profile, Mapping) or not profile:
        raise RolloutInvalid("candidate.profile", "must be a non-empty object (an engine profile)")
    if len(profile) > MAX_PROFILE_KEYS:
        raise RolloutInvalid("candidate.profile", f"at most {MAX_PROFILE_KEYS} keys")
    if len(json.dumps(profile, default=str)) > MAX_PROFILE_BYTES:
        raise RolloutInvalid("candidate.profile", f"at most {MAX_PROFILE_BYTES} bytes of JSON")
    return Candidate(
        CandidateKind(kind), dict(profile), checks_parse(body.get("checks"), CandidateKind(kind))
    )


_PLAN_KEYS = {"model", "candidate", "swapMode", "steps", "gates", "stickyHeader", "reason"}


def plan_parse(raw: Any) -> RolloutPlan:
    """Check a whole rollout request; raise RolloutInvalid naming the first field at fault."""
    body = _object(raw, "", _PLAN_KEYS)
    model = body.get("model")
    if not isinstance(model, str) or not model or len(model) > 200 or model != model.lower():
        raise RolloutInvalid("model", "must be a bound model's lower-case served name")
    mode = body.get("swapMode", SwapMode.NEW_PORT.value)
    if mode not in SwapMode.__members__.values():
        raise RolloutInvalid("swapMode", 'must be "new-port" or "in-place"')
    header = body.get("stickyHeader", "")
    if not isinstance(header, str) or (header and not STICKY_HEADER_RE.match(header)):
        raise RolloutInvalid("stickyHeader", "must be a lower-case header name or empty")
    reason = body.get("reason", "")
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        raise RolloutInvalid("reason", f"must be a string of at most {MAX_REASON_CHARS} characters")
    return RolloutPlan(
        model=model,
        candidate=candidate_parse(body.get("candidate")),
        swap_mode=SwapMode(mode),
        steps=steps_parse(body.get("steps", [dict(s) for s in DEFAULT_STEPS])),
        gates=gates_parse(body.get("gates")),
        sticky_header=header,
        reason=reason,
    )


@dataclass(frozen=True)
class GateDecision:
    verdict: GateVerdict
    reason: str
    # The figures the verdict was read from, for the event and the dashboard.
    figures: dict[str, Any] = field(default_factory=dict)


def _ratio(candidate: float | None, stable: float | None) -> float | None:
    if candidate is None or stable is None or stable <= 0:
        return None
    return candidate / stable


def gate_decide(windows: Mapping[Arm, ArmWindow], gates: Gates) -> GateDecision:
    """Judge the candidate against the stable arm over the same window.

    Wait until each arm has `minSamples` requests (and time-to-first-token samples); then fail
    on the first gate breached: the error rate, the p95 time to first token, the p95
    inter-token latency (the last only where both arms have that many streamed samples:
    traffic that never streams has none, and is not held up for it).
    """
    stable = windows.get(Arm.STABLE, ArmWindow())
    cand = windows.get(Arm.CANDIDATE, ArmWindow())
    figures: dict[str, Any] = {
        "stable": {"requests": stable.requests, "errors": stable.errors,
                   "ttftP95Ms": stable.ttft_p95_ms, "itlP95Ms": stable.itl_p95_ms},
        "candidate": {"requests": cand.requests, "errors": cand.errors,
                      "ttftP95Ms": cand.ttft_p95_ms, "itlP95Ms": cand.itl_p95_ms},
    }  # fmt: skip
    need = gates.min_samples
    short = [
        f"{name} has {w.requests}/{need} requests"
        for name, w in (("stable", stable), ("candidate", cand))
        if w.requests < need
    ]
    if short:
        return GateDecision(GateVerdict.WAIT, "not enough samples: " + ", ".join(short), figures)
    delta = (cand.error_rate or 0.0) - (stable.error_rate or 0.0)
    figures["errorRateDelta"] = round(delta, 6)
    if delta > gates.max_error_rate_delta:
        return GateDecision(
            GateVerdict.FAIL,
            f"error rate {cand.error_rate:.2%} on the candidate against "
            f"{stable.error_rate or 0:.2%} on the stable arm (delta {delta:.2%} > "
            f"{gates.max_error_rate_delta:.2%})",
            figures,
        )
    ttft_short = [
        f"{name} has {w.ttft_samples}/{need} time-to-first-token samples"
        for name, w in (("stable", stable), ("candidate", cand))
        if w.ttft_samples < need
    ]
    if ttft_short:
        return GateDecision(
            GateVerdict.WAIT, "not enough samples: " + ", ".join(ttft_short), figures
        )
    ttft = _ratio(cand.ttft_p95_ms, stable.ttft_p95_ms)
    figures["ttftP95Ratio"] = None if ttft is None else round(ttft, 4)
    if ttft is not None and ttft > gates.ttft_p95_ratio:
        return GateDecision(
            GateVerdict.FAIL,
            f"p95 time to first token {cand.ttft_p95_ms:.0f} ms on the candidate against "
            f"{stable.ttft_p95_ms:.0f} ms on the stable arm (x{ttft:.2f} > "
            f"x{gates.ttft_p95_ratio:g})",
            figures,
        )
    if stable.itl_samples >= need and cand.itl_samples >= need:
        itl = _ratio(cand.itl_p95_ms, stable.itl_p95_ms)
        figures["itlP95Ratio"] = None if itl is None else round(itl, 4)
        if itl is not None and itl > gates.itl_p95_ratio:
            return GateDecision(
                GateVerdict.FAIL,
                f"p95 inter-token latency {cand.itl_p95_ms:.0f} ms on the candidate against "
                f"{stable.itl_p95_ms:.0f} ms on the stable arm (x{itl:.2f} > "
                f"x{gates.itl_p95_ratio:g})",
                figures,
            )
    return GateDecision(GateVerdict.PASS, "every gate passed", figures)


@dataclass(frozen=True)
class CheckOutcome:
    passed: bool
    failures: tuple[str, ...] = ()

    def message(self) -> str:
        return "every answer check passed" if self.passed else "; ".join(self.failures)


def _clip(text: str | None, most: int = 120) -> str:
    text = text or ""
    return text if len(text) <= most else text[:most] + "…"


def expected_present(check: AnswerCheck, answer: str) -> bool:
    if check.match == MatchKind.REGEX:
        return re.search(check.expect, answer) is not None
    return check.expect in answer


def checks_judge(
    kind: CandidateKind,
    checks: Sequence[AnswerCheck],
    candidate_answers: Sequence[str | None],
    stable_answers: Sequence[str | None] | None = None,
) -> CheckOutcome:
    """Judge the candidate's answers, one per check, in order (None: no answer).

    Same weights: each answer must equal the stable arm's answer to the same prompt at
    temperature 0 (never the candidate's own earlier answer), and contain `expect` where one is
    written. New weights: each answer must contain its check's expected content.
    """
    failures = []
    for i, check in enumerate(checks):
        got = candidate_answers[i] if i < len(candidate_answers) else None
        label = f"check {i} ({_clip(check.prompt, 40)!r})"
        if got is None:
            failures.append(f"{label}: the candidate gave no answer")
            continue
        if kind == CandidateKind.SAME_WEIGHTS:
            want = stable_answers[i] if stable_answers and i < len(stable_answers) else None
            if want is None:
                failures.append(f"{label}: the stable arm gave no answer to compare with")
                continue
            if got != want:
                failures.append(
                    f"{label}: the candidate answered {_clip(got)!r}, the stable arm "
                    f"{_clip(want)!r}"
                )
                continue
        if check.expect and not expected_present(check, got):
            failures.append(
                f"{label}: expected {check.match.value} {_clip(check.expect)!r}, got {_clip(got)!r}"
            )
    return CheckOutcome(not failures, tuple(failures))


def weight_permille(percent: int) -> int:
    return percent * 10
