"""Celery tasks: beat fans out the fleets' ticks in batches; a waiting step re-queues its fleet.

Tasks take ids, are idempotent (a tick only moves what the world already shows), acknowledge
late (a worker that dies mid-tick leaves the message to be redelivered) and run under time
limits. Ticks of one fleet never overlap: the tick holds the fleet's lease
(`fleets.reconciler.locks`) and a second one skips.
"""

from __future__ import annotations

import functools
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
from celery import shared_task
from celery.signals import (
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_shutting_down,
)
from django.db import close_old_connections

from fleets.base import clock, stopping
from fleets.base.conf import haru_settings
from fleets.metrics.registry import mark_this_process_dead
from fleets.reconciler import datapath, kick
from fleets.reconciler.dispatch import dispatch_plan, fleets_provisioned
from fleets.reconciler.provision import fleet_provision_tick
from fleets.reconciler.tick import LEASE_RETRY_SLACK_MS, TickResult, tick_run
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


def _follow_up(fleet_id: str, result: TickResult) -> None:
    # Ran: a step waits. Skipped: look again when the holder's lease runs out (a killed or
    # frozen holder is taken over then, not at the next beat).
    if result.nudge_ms is not None:
        if result.ran:
            # This tick was the follow-up: let the next one be queued. A skipped tick leaves the
            # pending follow-up in place (one per fleet, however many beats skip meanwhile).
            _redis().delete(f"haru:nudge:{fleet_id}")
        celery_kicker(fleet_id, max(result.nudge_ms, 1))


@_task("fleets.reconcile_fleet", redeliver=True)
def reconcile_fleet(fleet_id: str) -> dict:
    """Run one tick of one fleet (skipped if another tick holds it); re-queue if a step waits."""
    result = tick_run(fleet_id=fleet_id)
    _follow_up(fleet_id, result)
    return {"fleetId": fleet_id, "ran": result.ran, "nudgeMs": result.nudge_ms}


# Beat's ticks travel this many fleets to a message (1,000 fleets: 50 messages an interval, not
# 2,000), ticked side by side in as many threads, so one slow host delays no other fleet and
# the batch ends within the same time limits as a single tick.
TICK_BATCH = 20


@functools.cache
def _batch_pool() -> ThreadPoolExecutor:
    # One per worker process, made on first use (after the pool's fork): its threads keep their
    # database connections from one batch to the next, as the in-process loop's do.
    return ThreadPoolExecutor(max_workers=TICK_BATCH, thread_name_prefix="haru-batch-tick")


def _batch_tick(fleet_id: str) -> dict:
    try:
        result = tick_run(fleet_id=fleet_id)
        _follow_up(fleet_id, result)
        return {"fleetId": fleet_id, "ran": result.ran, "nudgeMs": result.nudge_ms}
    except Exception:  # noqa: BLE001 - one fleet's failure must not stop its batch
        log.exception("reconcile tick of fleet %s failed", fleet_id)
        return {"fleetId": fleet_id, "ran": False, "error": True}
    finally:
        close_old_connections()


@_task("fleets.reconcile_batch")
def reconcile_batch(fleet_ids: list[str]) -> list[dict]:
    """Tick up to TICK_BATCH fleets side by side (each skipped if another tick holds it)."""
    return list(_batch_pool().map(_batch_tick, fleet_ids[:TICK_BATCH]))


@_task("fleets.datapath_report", redeliver=True)
def datapath_report(fleet_id: str, domain_id: str, model: str, failed_at: float) -> dict:
    """Note a proxy's data-path failure in this worker and tick the fleet, which confirms it."""
    datapath.suspect_note(fleet_id, domain_id, failed_at)
    result = tick_run(fleet_id=fleet_id, wait_s=_DATAPATH_TICK_WAIT_S)
    if result.ran and result.nudge_ms is not None:
        celery_kicker(fleet_id, max(result.nudge_ms, 1))
    return {"fleetId": fleet_id, "model": model, "ran": result.ran}


def _batches(ids: list[str], size: int) -> list[list[str]]:
    return [ids[start : start + size] for start in range(0, len(ids), size)]


@_task("fleets.reconcile_all")
def reconcile_all() -> list[str]:
    """Queue this interval's ticks of every fleet (or those in HARU_RECONCILE_FLEETS), batched.

    Fleets whose lease is held are not sent now but when it runs out (one follow-up each, however
    many beats pass), so a dead worker's fleets are ticked again within one lease; fleets ticked
    a moment ago (a kick's follow-up) wait for the next beat. Returns the ids sent now.
    """
    interval = _interval_s()
    plan = dispatch_plan(haru_settings().reconcile_fleets, interval_s=interval)
    for batch in _batches(plan.now, TICK_BATCH):
        # Expire with the beat: a backlog of stale ticks after an outage is pure waste.
        reconcile_batch.apply_async(args=[batch], expires=interval)
    for fleet_id, wait_s in plan.held.items():
        celery_kicker(fleet_id, int(wait_s * 1000) + LEASE_RETRY_SLACK_MS)
    for fleet_id in fleets_provisioned(plan.ids()):
        provision_fleet.apply_async(args=[fleet_id], expires=interval)
    return plan.now


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
