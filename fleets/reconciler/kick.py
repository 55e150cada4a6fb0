"""Ask for a fleet's next tick soon, through whatever drives ticks in this process.

One path: every kick (a tick's nudge, a data-path report, and the receivers below of
`operation_created` and `operation_ended`) goes to this process's `TickDriver`, which the
process's entry point chooses once with `drive`: the server's in-process loop or its broker
fallback (`fleets.server.driver`, the `reconcile` command), or the Celery task queue
(`fleets.tasks`, in every worker). With none chosen (tests, other management commands) a kick
does nothing, so nothing ticks behind a test's back.

The receivers make a promote or demote start right after its commit instead of at the next
beat, and a cancelled one's clean-up run at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.dispatch import receiver

from fleets.services.operations import operation_created, operation_ended

log = logging.getLogger(__name__)

Kicker = Callable[[str, int], None]
Reporter = Callable[[str, str, str, float], None]


@dataclass(frozen=True)
class TickDriver:
    """What drives ticks in this process."""

    # kick(fleet_id, delay_ms): tick the fleet within delay_ms.
    kick: Kicker
    # Carries a data-path failure report (fleet, domain, model, failed_at) to whoever confirms
    # it: Celery ships it to a worker as a task's arguments; None (the in-process loop), the
    # report already sits in this process's registry and a plain kick is enough.
    report: Reporter | None = None


class _Process:
    """The driver this process's entry point chose (none: kicks do nothing)."""

    driver: TickDriver | None = None


_process = _Process()


def drive(driver: TickDriver | None) -> None:
    """Make `driver` drive this process's ticks (None: none does)."""
    _process.driver = driver


def driver() -> TickDriver | None:
    """Return the driver of this process's ticks, if one was chosen."""
    return _process.driver


@receiver(operation_created, dispatch_uid="haru-kick-operation-created")
@receiver(operation_ended, dispatch_uid="haru-kick-operation-ended")
def _on_operation_moved(sender: object, *, fleet_id: str, **_kwargs: Any) -> None:
    fleet_kick(fleet_id, delay_ms=0)


def datapath_kick(fleet_id: str, domain_id: str, model: str, failed_at: float) -> None:
    """Ask for a tick that confirms a data-path failure at once; never raises."""
    chosen = _process.driver
    if chosen is None or chosen.report is None:
        fleet_kick(fleet_id, delay_ms=0)
        return
    try:
        chosen.report(str(fleet_id), str(domain_id), model, float(failed_at))
    except Exception:  # noqa: BLE001 - a lost report costs the stale window, never the request
        log.warning("could not report a data-path failure for fleet %s", fleet_id, exc_info=True)


def fleet_kick(fleet_id: str, *, delay_ms: int = 0) -> None:
    """Request a tick of `fleet_id` within `delay_ms`; never raises."""
    chosen = _process.driver
    if chosen is None:
        return
    try:
        chosen.kick(str(fleet_id), max(0, int(delay_ms)))
    except Exception:  # noqa: BLE001 - a lost kick costs one interval, never the request
        log.warning("could not schedule a tick for fleet %s", fleet_id, exc_info=True)
