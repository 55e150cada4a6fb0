"""The fleet page's rollout panel: the newest rollout, its arms against its gates, its buttons.

Read-only: the arms' figures are the gates' own input (`arm_windows` over the gate window,
never from before the current step began) judged by the gates' own rule (`gate_decide`), so
the panel shows what the reconciler acts on. The buttons post to the dashboard's actions, which
call the rollout services as the API does.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fleets.base.clock import iso
from fleets.core.adapter_rollout import is_adapter
from fleets.core.arm_stats import Arm, ArmWindow
from fleets.core.rollout import (
    IN_FLIGHT_ROLLOUT_STATES,
    PAUSABLE,
    RolloutState,
    gate_decide,
    gates_parse,
)
from fleets.models import Fleet, ModelBinding, Rollout
from fleets.reads.arm_stats import arm_windows
from fleets.reads.rollouts import fleet_rollouts

# Where the weight is live and the gates are read (else the figures are not shown).
_MEASURED = (RolloutState.STEPPING.value, RolloutState.PAUSED.value)
# The profile keys that name a version, in the order shown (the rest is in the API's answer).
_VERSION_KEYS = ("modelPath", "image", "engineVersion", "quantization")
_ABORTABLE = ("pending", "preparing", "checking", "stepping", "paused")


def version_label(profile: object) -> str:
    """A short name for a profile: its model path, image or engine version, else its flags."""
    if not isinstance(profile, dict) or not profile:
        return "?"
    named = [str(profile[k]) for k in _VERSION_KEYS if profile.get(k)]
    if named:
        return " · ".join(named)
    args = profile.get("extraArgs")
    if isinstance(args, list) and args:
        text = " ".join(str(a) for a in args)
        return text if len(text) <= 80 else text[:79] + "…"
    return str(profile.get("engine") or "?")


def _arm_figures(window: ArmWindow) -> dict[str, Any]:
    rate = window.errors / window.requests if window.requests else None
    return {
        "requests": window.requests,
        "errors": window.errors,
        "error_rate_pct": None if rate is None else round(rate * 100, 2),
        "ttft_p95_ms": None if window.ttft_p95_ms is None else round(window.ttft_p95_ms),
        "itl_p95_ms": None if window.itl_p95_ms is None else round(window.itl_p95_ms, 1),
    }


def rollout_panel(fleet: Fleet, slugs: dict[Any, str], now: datetime) -> dict[str, Any] | None:
    """The panel's context for the fleet's newest rollout (None: the fleet never had one)."""
    newest = fleet_rollouts(fleet.pk, limit=1)
    if not newest:
        return None
    rollout: Rollout = newest[0]
    steps = rollout.steps if isinstance(rollout.steps, list) else []
    gates = gates_parse(rollout.gates)
    # What the stable domain ran before the rollout (kept per domain for the rollback).
    before = (rollout.previous or {}).get(str(rollout.stable_domain_id)) or {}
    stable_profile = before.get("profile") if isinstance(before, dict) else None
    if not stable_profile and rollout.stable_domain_id is not None:
        stable_profile = (
            ModelBinding.objects.filter(domain_id=rollout.stable_domain_id, name=rollout.model)
            .values_list("profile", flat=True)
            .first()
        )
    candidate = rollout.candidate if isinstance(rollout.candidate, dict) else {}
    arms: dict[str, dict[str, Any]] = {
        Arm.STABLE.value: {
            "domain": slugs.get(rollout.stable_domain_id, "?"),
            "version": version_label(stable_profile),
        },
        Arm.CANDIDATE.value: {
            "domain": slugs.get(rollout.candidate_domain_id, "?"),
            "version": version_label(candidate.get("profile")),
        },
    }
    if is_adapter(candidate):
        # An adapter version's rollout: both arms are on the active, told apart by version.
        route = (rollout.previous or {}).get("route") or {}
        arms[Arm.STABLE.value]["version"] = f"{rollout.model}@v{route.get('version', '?')}"
        arms[Arm.CANDIDATE.value].update(
            domain=arms[Arm.STABLE.value]["domain"],
            version=f"{rollout.model}@v{candidate.get('version', '?')}",
        )
    verdict = reason = ""
    if rollout.state in _MEASURED and rollout.step_started_at is not None:
        since = max(rollout.step_started_at, now - timedelta(seconds=gates.window_s))
        windows = arm_windows(rollout_id=str(rollout.id), model=rollout.model, since=since)
        for arm, window in windows.items():
            arms[arm.value]["figures"] = _arm_figures(window)
        decision = gate_decide(windows, gates)
        verdict, reason = decision.verdict.value, decision.reason
    step = rollout.step_index
    in_flight = rollout.state in IN_FLIGHT_ROLLOUT_STATES
    return {
        "id": str(rollout.id),
        "short_id": str(rollout.id)[:8],
        "model": rollout.model,
        # An adapter version's rollout promotes and aborts by a route write, not a swap: the
        # confirmations say so.
        "adapter": is_adapter(candidate),
        "state": rollout.state,
        "in_flight": in_flight,
        "pinned": rollout.pinned,
        "paused_from": rollout.paused_from,
        "why": rollout.why,
        "started_by": rollout.started_by,
        "weight_pct": rollout.weight_permille / 10,
        "step": f"{step + 1} of {len(steps)}" if step >= 0 else f"– of {len(steps)}",
        "steps": [s.get("weight") for s in steps if isinstance(s, dict)],
        "arms": [arms[Arm.STABLE.value], arms[Arm.CANDIDATE.value]],
        "stable": arms[Arm.STABLE.value],
        "candidate": arms[Arm.CANDIDATE.value],
        "gates": {
            "max_error_rate_delta_pct": round(gates.max_error_rate_delta * 100, 2),
            "ttft_p95_ratio": gates.ttft_p95_ratio,
            "itl_p95_ratio": gates.itl_p95_ratio,
            "min_samples": gates.min_samples,
            "window_s": gates.window_s,
        },
        "verdict": verdict,
        "verdict_reason": reason,
        "breach_to_weight_change_ms": (rollout.progress or {}).get("breachToWeightChangeMs"),
        "updated_at": iso(rollout.updated_at),
        # The services refuse what they must (a promotion under way); these only hide buttons
        # that could never work.
        "can_pause": rollout.state in PAUSABLE and not rollout.pinned,
        "can_resume": rollout.state == RolloutState.PAUSED.value,
        # As the service allows it: past the answer checks (stepping, or paused while stepping).
        "can_promote": rollout.state == RolloutState.STEPPING.value
        or (
            rollout.state == RolloutState.PAUSED.value
            and rollout.paused_from == RolloutState.STEPPING.value
        ),
        "can_abort": rollout.state in _ABORTABLE,
    }
