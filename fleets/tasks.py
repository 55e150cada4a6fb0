"""Celery tasks: beat fans out one tick per fleet; a waiting step re-queues its fleet soon.

Tasks take ids, are idempotent (a tick only moves what the world already shows), acknowledge
late (a worker that dies mid-tick leaves the message to be redelivered) and run under time
limits. Ticks of one fleet never overlap: the tick holds the fleet's lease
(`fleets.reconciler.locks`) and a second one skips.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import redis
from celery import shared_task
from celery.signals import (
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_shutting_down,
)

from fleets.base import clock, stopping
from fleets.base.conf import haru_settings
from fleets.metrics.registry import mark_this_process_dead
from fleets.reconciler import datapath, kick
from fleets.reconciler.provision import fleet_provision_tick
from fleets.reconciler.tick import fleets_to_reconcile, tick_run
from fleets.services.retention import history_prune, retention_cutoff

log = logging.getLogger(__name__)

# A tick starts no step after 5 s and each supervisor call is capped at 10 s; the soft limit
# leaves room for a heartbeat round plus one capped call, the hard limit kills a stuck worker
# (its lease then runs out unrenewed, HARU_TICK_LEASE_MS later).
SOFT_LIMIT_S = 45
HARD_LIMIT_S = 60
# The broker client's bounds (see also the CELERY_BROKER_* settings in haru/settings.py).
BROKER_CONNECT_TIMEOUT_S = 1.0
BROKER_SOCKET_TIMEOUT_S = 2.0
# Follow-ups of one fleet are deduplicated for this long, so beat plus nudges never pile up.
_NUDGE_DEDUPE_MS = 1000


@functools.cache
def _redis() -> redis.Redis:
    """Return this process's Redis client (a connection pool, safe to share across threads)."""
    return _redis_for(haru_settings().redis_url)


@functools.lru_cache(maxsize=4)
def _redis_for(url: str) -> redis.Redis:
    # One client per URL and process, so a kick reuses a pooled connection instead of opening
    # one (redis-py's pool starts afresh in a forked child). Bounded: a kick or a probe against
    # a stopped or frozen Redis fails in about a second, and the server's own loop takes the
    # tick (fleets.server.driver).
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=BROKER_CONNECT_TIMEOUT_S,
        socket_timeout=BROKER_SOCKET_TIMEOUT_S,
    )


def broker_ping() -> bool:
    """Whether the broker answers a PING within its bounded timeouts."""
    try:
        return bool(_redis().ping())
    except redis.RedisError:
        return False


def _interval_s() -> float:
    return (haru_settings().reconcile_interval_ms or 5000) / 1000


def celery_kicker(fleet_id: str, delay_ms: int) -> None:
    """Queue a tick of `fleet_id` in `delay_ms`, at most one pending follow-up per fleet."""
    if delay_ms > 0:
        # A waiting step asks again every few hundred ms; one queued follow-up per fleet is enough.
        key = f"haru:nudge:{fleet_id}"
        if not _redis().set(key, "1", nx=True, px=max(delay_ms, _NUDGE_DEDUPE_MS)):
            return
    reconcile_fleet.apply_async(
        args=[fleet_id], countdown=delay_ms / 1000, expires=delay_ms / 1000 + _interval_s() * 3
    )


def celery_reporter(fleet_id: str, domain_id: str, model: str, failed_at: float) -> None:
    """Carry a data-path failure report to a worker, which confirms it in the tick it runs."""
    datapath_report.apply_async(
        args=[fleet_id, domain_id, model, failed_at], expires=_DATAPATH_REPORT_EXPIRES_S
    )


# A report the workers could not take up within this long is stale news: the next beat's
# heartbeat sees the same host.
_DATAPATH_REPORT_EXPIRES_S = 5.0
# How long the report's tick waits for one already running (whose heartbeat may be the one
# that would miss the report: the registry is per process).
_DATAPATH_TICK_WAIT_S = 2.0


def _task(
    name: str, *, redeliver: bool = False, soft_s: int = SOFT_LIMIT_S, hard_s: int = HARD_LIMIT_S
) -> Any:
    """Declare a Haru task: acknowledged late, under a soft and a hard time limit, no result
    kept; `redeliver`: a message whose worker died mid-task goes back to the queue."""
    return shared_task(
        name=name,
        acks_late=True,
        soft_time_limit=soft_s,
        time_limit=hard_s,
        ignore_result=True,
        **({"reject_on_worker_lost": True} if redeliver else {}),
    )


@worker_init.connect
def _share_stopping(**_kwargs) -> None:
    # The worker's main process, before its pool forks: the children (where ticks run) then
    # see the main process begin its shutdown.
    stopping.share_with_children()


@worker_shutting_down.connect
def _stop_ticking(**_kwargs) -> None:
    # Sent first thing on SIGTERM or SIGINT, in the main process (inside its signal handler).
    # A warm shutdown lets running tasks finish: a tick running in a pool child stops at its
    # next checkpoint instead, before it writes what the stop looks like (hosts stopping too).
    stopping.begin()


@worker_process_init.connect
def _drive_with_celery(**_kwargs) -> None:
    # Inside a worker, operations created by a tick (auto-failover) are kicked through Celery.
    kick.drive(kick.TickDriver(celery_kicker, celery_reporter))


@worker_process_shutdown.connect
def _mark_metrics_dead(**_kwargs) -> None:
    # The pool process's counters stay in the host's metrics directory for /metrics to sum.
    mark_this_process_dead()


@_task("fleets.reconcile_fleet", redeliver=True)
def reconcile_fleet(fleet_id: str) -> dict:
    """Run one tick of one fleet (skipped if another tick holds it); re-queue if a step waits."""
    result = tick_run(fleet_id=fleet_id)
    # Ran: a step waits. Skipped: look again when the holder's lease runs out (a killed or
    # frozen holder is taken over then, not at the next beat).
    if result.nudge_ms is not None:
        if result.ran:
            # This tick was the follow-up: let the next one be queued. A skipped tick leaves the
            # pending follow-up in place (one per fleet, however many beats skip meanwhile).
            _redis().delete(f"haru:nudge:{fleet_id}")
        celery_kicker(fleet_id, max(result.nudge_ms, 1))
    return {"fleetId": fleet_id, "ran": result.ran, "nudgeMs": result.nudge_ms}


@_task("fleets.datapath_report", redeliver=True)
def datapath_report(fleet_id: str, domain_id: str, model: str, failed_at: float) -> dict:
    """Note a proxy's data-path failure in this worker and tick the fleet, which confirms it."""
    datapath.suspect_note(fleet_id, domain_id, failed_at)
    result = tick_run(fleet_id=fleet_id, wait_s=_DATAPATH_TICK_WAIT_S)
    if result.ran and result.nudge_ms is not None:
        celery_kicker(fleet_id, max(result.nudge_ms, 1))
    return {"fleetId": fleet_id, "model": model, "ran": result.ran}


@_task("fleets.reconcile_all")
def reconcile_all() -> list[str]:
    """Queue a tick for every fleet (or those in HARU_RECONCILE_FLEETS)."""
    ids = fleets_to_reconcile(haru_settings().reconcile_fleets)
    for fleet_id in ids:
        # Expire with the beat: a backlog of stale ticks after an outage is pure waste.
        reconcile_fleet.apply_async(args=[fleet_id], expires=_interval_s())
        provision_fleet.apply_async(args=[fleet_id], expires=_interval_s())
    return ids


# A provisioning pass makes a few `sky` calls per managed domain, each capped (status with
# --refresh at 90 s); the limits leave room for two such domains and kill a hung one.
PROVISION_SOFT_LIMIT_S = 300
PROVISION_HARD_LIMIT_S = 330


@_task(
    "fleets.provision_fleet",
    redeliver=True,
    soft_s=PROVISION_SOFT_LIMIT_S,
    hard_s=PROVISION_HARD_LIMIT_S,
)
def provision_fleet(fleet_id: str) -> dict:
    """Run one provisioning pass of one fleet (skipped if another pass holds it)."""
    result = fleet_provision_tick(fleet_id=fleet_id)
    return {"fleetId": fleet_id, "ran": result.ran, "busy": result.busy}


@_task("fleets.prune_history", soft_s=600, hard_s=900)
def prune_history() -> dict:
    """Drop events and finished operations older than HARU_EVENT_RETENTION_DAYS."""
    days = haru_settings().event_retention_days
    report = history_prune(older_than=retention_cutoff(clock.now(), days))
    if report.events or report.operations:
        log.info(
            "retention: pruned %d event(s), %d operation(s) older than %d day(s)",
            report.events,
            report.operations,
            days,
        )
    return {"events": report.events, "operations": report.operations}
