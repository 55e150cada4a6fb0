"""Detection from the data path: a proxy that cannot reach the active tells the reconciler.

The proxy calls `report_unreachable` when a request could not reach the active's model server
(connection refused). Never a database write on the request path: the report is noted in this
process's registry (the earliest failure per fleet and domain, bounded) and a kick asks for a
tick at once, through the process's tick driver (`kick.drive`): its reporter (Celery: a task
carrying the report to a worker) or a plain kick (the in-process loop, which reads this
registry).

The tick then confirms with targeted heartbeats (`confirm_active`): the supervisor and every
model server of the active, twice, `dataPathConfirmIntervalMs` apart. Both rounds refused
everywhere => the host's processes are gone: the active is failed (and auto-failover follows
the policy). A timeout anywhere keeps the stale window (a partition looks the same as a slow
host); a live supervisor with dead model servers is degraded by the heartbeat and follows its
grace. One failed request never fails anything over: the reconciler's own checks decide.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from fleets.base import clock, stopping
from fleets.core.model_health import Verdict
from fleets.core.policy import Policy
from fleets.models import Domain, Id
from fleets.reconciler import kick
from fleets.reconciler.heartbeat import Beat, beat_one, heartbeat_apply, serving_urls_of
from fleets.reconciler.supervisor.client import SupervisorClient
from fleets.services.unreachable import domain_unreachable_fail

log = logging.getLogger(__name__)

# At most one report per (fleet, domain) this often from one process: a burst of failed
# requests is one piece of news, not a storm of ticks.
REPORT_EVERY_S = 0.2
# A failure older than this is forgotten (no confirmation ran: no tick driver, or it was
# not confirmed and no failover followed); bounds what the registry keeps and what it claims.
SUSPECT_TTL_S = 60.0
# Distinct (fleet, domain) keys kept at most: reports carry ids from our own snapshots, but a
# bound keeps a bug from growing the process.
MAX_SUSPECTS = 1024


@dataclass
class _Suspect:
    first_failed_at: float  # epoch seconds of the earliest failed request
    noted_at: float  # monotonic, for the TTL
    pending: bool  # a confirmation is owed


class _Registry:
    """What this process noted: failures per (fleet, domain), and when each was last reported."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.suspects: dict[tuple[str, str], _Suspect] = {}
        self.last_report: dict[tuple[str, str], float] = {}


@functools.cache
def _registry() -> _Registry:
    """This process's registry (a test starts afresh with `_registry.cache_clear()`)."""
    return _Registry()


def report_unreachable(fleet_id: str, domain_id: str, model: str, failed_at: float) -> None:
    """Report that a request to `model` on `domain_id` could not reach its server.

    `failed_at`: time.time() of the first failed request. Non-blocking, never raises, at most
    one kick per (fleet, domain) per REPORT_EVERY_S from this process.
    """
    if stopping.is_stopping():
        # A stopping server's refused connections are its hosts stopping with it, most likely:
        # not news for a reconciler (one still running sees a real outage by its heartbeats).
        return
    try:
        key = (str(fleet_id), str(domain_id))
        failed_at = _bounded(float(failed_at))
        now = time.monotonic()
        registry = _registry()
        with registry.lock:
            _note(registry.suspects, key, failed_at, now)
            last = registry.last_report.get(key)
            if last is not None and 0 <= now - last < REPORT_EVERY_S:
                return
            if len(registry.last_report) >= MAX_SUSPECTS:
                registry.last_report.clear()
            registry.last_report[key] = now
        kick.datapath_kick(key[0], key[1], model, failed_at)
    except Exception:  # noqa: BLE001 - the data path must never fail because of a report
        log.warning("data-path report for fleet %s dropped", fleet_id, exc_info=True)


def suspect_note(fleet_id: str, domain_id: str, failed_at: float) -> None:
    """Note a report that arrived from another process (the Celery task's entry)."""
    registry = _registry()
    with registry.lock:
        _note(
            registry.suspects,
            (str(fleet_id), str(domain_id)),
            _bounded(float(failed_at)),
            time.monotonic(),
        )


def _bounded(failed_at: float) -> float:
    """Keep a reported time within what it can honestly be: not in the future, not older than
    SUSPECT_TTL_S (a skewed or bogus clock must not stretch the recorded outage)."""
    now = clock.now().timestamp()
    if not math.isfinite(failed_at):
        return now
    return min(now, max(now - SUSPECT_TTL_S, failed_at))


def _note(
    suspects: dict[tuple[str, str], _Suspect], key: tuple[str, str], failed_at: float, now: float
) -> None:
    held = suspects.get(key)
    if held is not None and now - held.noted_at > SUSPECT_TTL_S:
        held = None
    if held is None:
        if len(suspects) >= MAX_SUSPECTS:
            for old in [k for k, s in suspects.items() if now - s.noted_at > SUSPECT_TTL_S]:
                del suspects[old]
            if len(suspects) >= MAX_SUSPECTS:
                return
        suspects[key] = _Suspect(failed_at, now, True)
        return
    held.first_failed_at = min(held.first_failed_at, failed_at)
    held.pending = True


def first_failed_at(fleet_id: Id, domain_id: Id) -> datetime | None:
    """The earliest failed data-path request to the domain this process knows of, if recent."""
    registry = _registry()
    with registry.lock:
        held = registry.suspects.get((str(fleet_id), str(domain_id)))
        if held is None or time.monotonic() - held.noted_at > SUSPECT_TTL_S:
            return None
        return datetime.fromtimestamp(held.first_failed_at, tz=UTC)


def _take_pending(fleet_id: Id, domain_id: Id) -> bool:
    registry = _registry()
    with registry.lock:
        held = registry.suspects.get((str(fleet_id), str(domain_id)))
        if held is None or not held.pending:
            return False
        held.pending = False
        return True


def forget(fleet_id: Id, domain_id: Id | None = None) -> None:
    """Drop what is noted for a fleet (or one of its domains): routing moved, or it recovered."""
    registry = _registry()
    with registry.lock:
        for key in [k for k in registry.suspects if k[0] == str(fleet_id)]:
            if domain_id is None or key[1] == str(domain_id):
                del registry.suspects[key]


@dataclass(frozen=True)
class Confirmation:
    """What a confirmation did: the verdicts of its rounds, and whether it failed the active."""

    verdicts: tuple[Verdict, ...]
    failed: bool


def confirm_active(
    *,
    fleet_id: Id,
    active: Domain,
    tick_beat: Beat | None,
    policy: Policy,
    client_for: Callable[[Domain], SupervisorClient],
    operation_in_flight: bool,
    actor: str = "reconciler",
    checkpoint: Callable[[], None] | None = None,
) -> Confirmation | None:
    """Confirm a suspected dead active with targeted heartbeats; None when nothing is owed.

    Owed when a data-path report is pending for the active, or when this tick's own heartbeat
    found its supervisor and model servers all refusing (the same evidence, without traffic).
    `checkpoint` (the tick's) runs before anything the rounds saw is written: a process that
    began to stop meanwhile writes none of it.
    """
    reported = _take_pending(fleet_id, active.id)
    suspicious = tick_beat is not None and tick_beat.verdict() == Verdict.GONE
    if not reported and not suspicious:
        return None
    urls = serving_urls_of(active.id)
    if not urls:
        return None
    checked_since = clock.now()
    verdicts: list[Verdict] = []
    beat: Beat | None = None
    for round_no in range(2):
        if round_no:
            clock.get_clock().sleep(policy.data_path_confirm_interval_ms / 1000)
        beat = beat_one(active, policy=policy, client_for=client_for, serving_urls=urls)
        verdicts.append(beat.verdict())
        if verdicts[-1] != Verdict.GONE:
            break
    assert beat is not None  # two rounds at most, one at least
    if checkpoint is not None:
        checkpoint()

    def mirror() -> None:
        # What the last round saw is a heartbeat like any other: mirror it (model health,
        # slots). After the verdict's own write, whose guard it would otherwise trip.
        heartbeat_apply(
            beat, active_domain_id=active.id, operation_in_flight=operation_in_flight, actor=actor
        )

    if verdicts != [Verdict.GONE, Verdict.GONE]:
        mirror()
        if verdicts[-1] == Verdict.FINE:
            forget(fleet_id, active.id)  # not confirmed: the failure was the client's or passed
        return Confirmation(tuple(verdicts), failed=False)
    first = first_failed_at(fleet_id, active.id)
    evidence = {
        "checks": len(verdicts),
        "intervalMs": policy.data_path_confirm_interval_ms,
        "firstFailedRequestAt": clock.iso(first) if first else None,
        "reported": reported,
    }
    failed = domain_unreachable_fail(
        domain_id=active.id, checked_since=checked_since, now=clock.now(), evidence=evidence
    )
    mirror()
    if failed:
        log.warning("active %s unreachable: supervisor and model servers refuse", active.slug)
    return Confirmation(tuple(verdicts), failed=failed)
