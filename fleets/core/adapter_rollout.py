"""Adapter rollouts: a new version of a LoRA adapter reaches users through the rollout machinery.

An adapter rollout is a `Rollout` whose candidate is `{"kind": "adapter", "adapter": NAME,
"version": N, "checks": [...]}` and whose `model` is the adapter's name. It reuses the rollout
states (fleets/core/rollout.py) with another meaning for some of them:

    pending -> preparing   (wait until version N's copy on the ACTIVE domain is probed: the
                            registry transfers, loads and probes it against the trainer's answers)
            -> checking    (the operator's own answer checks, if any, against `NAME@vN`)
            -> stepping    (the adapter route's candidate = N with the step's weight; the gates
                            read the proxies' per-arm samples of this rollout, as a model's do)
            -> promoting   (at 100 % and after its dwell: ONE compare-and-swap makes the route
                            name N, no candidate)
            -> finishing -> succeeded
    a breach, a failed copy, an abort -> rolling_back (ONE compare-and-swap: the candidate and
                            its weight go, the version stays) -> rolled_back | aborted

It never touches the routing pointer, a standby's trainer or a model swap: the versions live on
every domain, so it may run beside a failover. The fleet still holds one rollout in flight at a
time (the database's partial unique index), model or adapter: the simplest rule, and a model
rollout swaps the very base model an adapter runs on.

Pure: no ORM, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from common.adapter_manifest import name_valid
from fleets.core.adapter_route import MAX_VERSION, AdapterRoute
from fleets.core.rollout import (
    MAX_REASON_CHARS,
    AnswerCheck,
    CandidateKind,
    Gates,
    RolloutInvalid,
    Step,
    _object,
    checks_parse,
    gates_parse,
    steps_parse,
)
from fleets.core.route_split import _HEADER as STICKY_HEADER_RE

ADAPTER_KIND = "adapter"

# The steps an adapter rollout takes when neither its request nor the fleet's policy names any:
# shorter than a model's (an adapter is small, and is rolled out as often as it is trained).
DEFAULT_ADAPTER_STEPS = ({"weight": 5, "dwellS": 120}, {"weight": 25, "dwellS": 300},
                         {"weight": 50, "dwellS": 300}, {"weight": 100, "dwellS": 60})  # fmt: skip
# How long a rollout waits for its version's copy on the active to be probed (the transfer of a
# few hundred MiB between domains, a load, a probe) before it gives up on it, saying so.
DEFAULT_PREPARE_TIMEOUT_MS = 30 * 60 * 1000


def is_adapter(candidate: Any) -> bool:
    """Whether a rollout's stored (or requested) candidate is an adapter version."""
    return isinstance(candidate, Mapping) and candidate.get("kind") == ADAPTER_KIND


@dataclass(frozen=True)
class AdapterCandidate:
    adapter: str
    version: int
    checks: tuple[AnswerCheck, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": ADAPTER_KIND,
            "adapter": self.adapter,
            "version": self.version,
            "checks": [c.as_json() for c in self.checks],
        }


@dataclass(frozen=True)
class AdapterPlan:
    """A checked adapter rollout request: what the service stores."""

    candidate: AdapterCandidate
    steps: tuple[Step, ...]
    gates: Gates
    sticky_header: str = ""
    reason: str = ""

    @property
    def model(self) -> str:
        return self.candidate.adapter


def adapter_candidate_parse(raw: Any) -> AdapterCandidate:
    body = _object(raw, "candidate", {"kind", "adapter", "version", "checks"})
    if body.get("kind") != ADAPTER_KIND:
        raise RolloutInvalid("candidate.kind", f'must be "{ADAPTER_KIND}"')
    name = body.get("adapter")
    if not name_valid(name):
        raise RolloutInvalid("candidate.adapter", "must be an adapter's name")
    version = body.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_VERSION:
        raise RolloutInvalid("candidate.version", "must be a version number from 1")
    raw_checks = body.get("checks") or []
    # Optional: the registry already proved the trainer's own answers; an operator's checks are
    # extra, and each must say what the answer contains (new weights' rule).
    checks = checks_parse(raw_checks, CandidateKind.NEW_WEIGHTS) if raw_checks else ()
    return AdapterCandidate(str(name), version, checks)


_PLAN_KEYS = {"model", "candidate", "steps", "gates", "stickyHeader", "reason"}


def adapter_plan_parse(
    raw: Any,
    *,
    default_steps: Any = None,
    default_gates: Mapping[str, Any] | None = None,
) -> AdapterPlan:
    """Check an adapter rollout request; raise RolloutInvalid naming the first field at fault.
    `model`, when given, must be the adapter's name; steps and gates left out take the fleet's
    adapter plan (`default_*`, from its policy), then the built-in defaults."""
    body = _object(raw, "", _PLAN_KEYS)
    candidate = adapter_candidate_parse(body.get("candidate"))
    model = body.get("model", candidate.adapter)
    if model != candidate.adapter:
        raise RolloutInvalid("model", "must be the adapter's name (candidate.adapter)")
    header = body.get("stickyHeader", "")
    if not isinstance(header, str) or (header and not STICKY_HEADER_RE.match(header)):
        raise RolloutInvalid("stickyHeader", "must be a lower-case header name or empty")
    reason = body.get("reason", "")
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        raise RolloutInvalid("reason", f"must be a string of at most {MAX_REASON_CHARS} characters")
    steps = body.get("steps")
    if steps is None:
        steps = list(default_steps or [dict(s) for s in DEFAULT_ADAPTER_STEPS])
    gates = body.get("gates")
    if gates is None and default_gates:
        gates = dict(default_gates)
    return AdapterPlan(candidate, steps_parse(steps), gates_parse(gates), header, reason)


def route_stepped(
    route: AdapterRoute, *, version: int, permille: int, rollout_id: str, sticky_header: str
) -> AdapterRoute:
    """The route with `version` as its candidate at `permille` for rollout `rollout_id`."""
    return AdapterRoute(
        base=route.base,
        version=route.version,
        candidate=version,
        weight_permille=permille,
        rollout_id=rollout_id,
        sticky_header=sticky_header or route.sticky_header,
        pinned=route.pinned,
    )


def route_promoted(route: AdapterRoute, version: int) -> AdapterRoute:
    """The route after a rollout's success: it names `version`, alone."""
    return AdapterRoute(
        base=route.base,
        version=version,
        sticky_header=route.sticky_header,
        pinned=route.pinned,
    )


def owns(route: AdapterRoute | None, rollout_id: str) -> bool:
    """Whether `route`'s candidate is this rollout's (a rollback removes only its own)."""
    return route is not None and route.candidate is not None and route.rollout_id == rollout_id


def auto_candidates(
    routes: Mapping[str, AdapterRoute],
    newest_ready: Mapping[str, int],
    tried: Mapping[str, frozenset[int]],
) -> list[tuple[str, int]]:
    """Which (name, version) an automatic rollout may start, in name order.

    `newest_ready`: per name, the newest registered version whose copy on the active is probed;
    `tried`: per name, the versions a rollout was ever made for (a version rolled back once is
    never started again on its own: the next trained version is). A route that is pinned, that
    has a candidate already, or names that version or a newer one is left alone.
    """
    out = []
    for name in sorted(routes):
        route = routes[name]
        version = newest_ready.get(name)
        if version is None or route.pinned or route.candidate is not None:
            continue
        if version <= route.version or version in tried.get(name, frozenset()):
            continue
        out.append((name, version))
    return out
