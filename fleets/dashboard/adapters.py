"""The fleet page's adapters panel: each adapter name's route, its newest versions with their
copy on each domain, its rollout's arms, and how fresh what users get is.

Read-only, from the same reads as the API (`fleets.reads.adapters`); the rollout's arms are the
gates' own input (`arm_windows` over the gate window of the current step), as the rollout panel
shows them. Pin, unpin and rollouts go through the API (docs/rollouts.md).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fleets.core.arm_stats import Arm
from fleets.core.rollout import gate_decide, gates_parse
from fleets.dashboard.rollout import _arm_figures
from fleets.models import Fleet, Rollout
from fleets.reads.adapters import fleet_adapters
from fleets.reads.arm_stats import arm_windows

# Versions shown per name on the page (the API lists more).
SHOWN_VERSIONS = 5


def age_label(seconds: float | None) -> str:
    """`3 h 20 min`, `2 d 4 h`, `45 s`; "–" when unknown."""
    if seconds is None:
        return "–"
    s = int(seconds)
    if s < 120:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 2 * 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def _arms(rollout_id: str, name: str, now: datetime) -> dict[str, Any] | None:
    rollout = Rollout.objects.filter(pk=rollout_id).first()
    if rollout is None or rollout.step_started_at is None:
        return None
    gates = gates_parse(rollout.gates)
    since = max(rollout.step_started_at, now - timedelta(seconds=gates.window_s))
    windows = arm_windows(rollout_id=rollout_id, model=name, since=since)
    decision = gate_decide(windows, gates)
    return {
        "stable": _arm_figures(windows[Arm.STABLE]),
        "candidate": _arm_figures(windows[Arm.CANDIDATE]),
        "verdict": decision.verdict.value,
        "reason": decision.reason,
    }


def adapters_panel(fleet: Fleet, now: datetime) -> list[dict[str, Any]]:
    """The panel's context: one entry per adapter name (empty: the fleet has none)."""
    out = []
    for adapter in fleet_adapters(fleet, now):
        fresh = adapter["freshness"] or {}
        rollout = adapter["rollout"]
        route = adapter["route"]
        arms = None
        if rollout is not None and rollout["state"] in ("stepping", "paused"):
            arms = _arms(rollout["id"], adapter["name"], now)
        out.append(
            {
                "name": adapter["name"],
                "route": route,
                "weight_pct": (route or {}).get("weightPermille", 0) / 10,
                "rollout": rollout,
                "arms": arms,
                "served_age": age_label(fresh.get("servedAgeS")),
                "checkpoint_to_first_token": age_label(fresh.get("checkpointToFirstTokenS")),
                "versions": adapter["versions"][:SHOWN_VERSIONS],
            }
        )
    return out
