"""Ask for a fleet's next tick soon, through whatever drives ticks in this process.

The process entry point installs the driver: the server's in-process loop (`loop.py`), or the
Celery task queue (`fleets.tasks`, in the server with a broker and in every worker). With none
installed (tests, management commands) a kick does nothing, so nothing ticks behind a test's back.

Installing also registers the kick with `operations.on_operation_created` and
`on_operation_ended`: a promote or demote starts right after its commit instead of at the next
beat, and a cancelled one's clean-up runs at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fleets.services import operations

log = logging.getLogger(__name__)

Kicker = Callable[[str, int], None]
_kicker: Kicker | None = None
# Carries a data-path failure report (fleet, domain, model, failed_at) to whoever confirms it:
# Celery ships it to a worker as a task's arguments; unset (the in-process loop), the report
# already sits in this process's registry and a plain kick is enough.
Reporter = Callable[[str, str, str, float], None]
_reporter: Reporter | None = None


def _on_operation_created(fleet_id: str, operation_id: str) -> None:
    fleet_kick(fleet_id, delay_ms=0)


def _on_operation_ended(fleet_id: str) -> None:
    fleet_kick(fleet_id, delay_ms=0)


def install(kicker: Kicker | None) -> Kicker | None:
    """Make `kicker(fleet_id, delay_ms)` the driver of this process; return the previous one."""
    global _kicker
    previous, _kicker = _kicker, kicker
    hooks: list[tuple[list, Callable]] = [
        (operations.on_operation_created, _on_operation_created),
        (operations.on_operation_ended, _on_operation_ended),
    ]
    for registry, hook in hooks:
        if kicker is not None and hook not in registry:
            registry.append(hook)
        if kicker is None and hook in registry:
            registry.remove(hook)
    return previous


def install_reporter(reporter: Reporter | None) -> Reporter | None:
    """Make `reporter` carry data-path reports in this process; return the previous one."""
    global _reporter
    previous, _reporter = _reporter, reporter
    return previous


def datapath_kick(fleet_id: str, domain_id: str, model: str, failed_at: float) -> None:
    """Ask for a tick that confirms a data-path failure at once; never raises."""
    if _reporter is None:
        fleet_kick(fleet_id, delay_ms=0)
        return
    try:
        _reporter(str(fleet_id), str(domain_id), model, float(failed_at))
    except Exception:  # noqa: BLE001 - a lost report costs the stale window, never the request
        log.warning("could not report a data-path failure for fleet %s", fleet_id, exc_info=True)


def fleet_kick(fleet_id: str, *, delay_ms: int = 0) -> None:
    """Request a tick of `fleet_id` within `delay_ms`; never raises."""
    if _kicker is None:
        return
    try:
        _kicker(str(fleet_id), max(0, int(delay_ms)))
    except Exception:  # noqa: BLE001 - a lost kick costs one interval, never the request
        log.warning("could not schedule a tick for fleet %s", fleet_id, exc_info=True)
