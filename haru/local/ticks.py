"""Ticks driven from this process, as the end-to-end tests and benchmarks drive a fleet over
local hosts without a reconcile loop of the server's (Django must be set up)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from .processes import NotReady

T = TypeVar("T")


def drive(
    fleet_id: uuid.UUID | str, until: Callable[[], T], timeout: float = 20.0, poll_s: float = 0.5
) -> T:
    """Tick the fleet until `until()` returns something truthy, and return that; fail after
    `timeout` seconds."""
    from fleets.reconciler.tick import tick_run  # noqa: PLC0415 - needs the app registry ready

    deadline = time.monotonic() + timeout
    while True:
        result = tick_run(fleet_id=fleet_id, wait_s=5, poll_s=poll_s)
        value = until()
        if value:
            return value
        if time.monotonic() > deadline:
            raise NotReady(f"condition not reached within {timeout}s")
        # The tick says when the next one is worth running (a waiting step's poll).
        time.sleep(min(0.2, (result.nudge_ms or 100) / 1000))
