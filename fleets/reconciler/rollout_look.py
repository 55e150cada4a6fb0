"""What one look at a rollout works with, whichever kind it is (a model's through the standby,
fleets/reconciler/rollout.py; an adapter version's on the active,
fleets/reconciler/adapter_rollout.py): the row as read, the supervisors, the arms' figures,
the clock of the look, and the moves, each a compare-and-swap on the row's version."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fleets.core.arm_stats import Arm, ArmWindow
from fleets.core.policy import Policy
from fleets.models import Domain, Rollout
from fleets.reconciler.supervisor.client import SupervisorClient
from fleets.services.rollouts import rollout_move

# Reads the arms' windows of a rollout (fleets.reads.arm_stats.arm_windows; a fake in tests).
ArmReader = Callable[..., Mapping[Arm, ArmWindow]]


@dataclass
class LookContext:
    rollout: Rollout
    client_for: Callable[[Domain], SupervisorClient]
    reader: ArmReader
    actor: str
    now: datetime
    policy: Policy

    def move(self, **kwargs: Any) -> bool:
        return rollout_move(self.rollout, actor=self.actor, **kwargs)

    def progress(self, key: str, default: Any = None) -> Any:
        return (self.rollout.progress or {}).get(key, default)

    def since(self, key: str) -> float | None:
        """Seconds since the ISO time stored at `progress[key]` (None: not stored)."""
        raw = self.progress(key)
        if not raw:
            return None
        return (self.now - datetime.fromisoformat(raw)).total_seconds()
