"""The in-process reconcile loop: the embedded default's replacement for Celery beat.

Ticks every fleet (or those in `HARU_RECONCILE_FLEETS`) every interval, fleets side by side in
a small thread pool, never one fleet twice at once, and an error in one fleet's tick never
stops the others. A tick that hands back with a nudge (a step waiting on the outside world) is
scheduled again that soon instead of a whole interval later; `request` does the same for a
kick (a new operation). Once per interval the loop reads every fleet's tick lease at once
(`fleets.reconciler.dispatch`): a fleet another process holds, or ticked a moment ago (several
servers' loops sharing the fleets), waits until then instead of costing a skipped tick.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django.db import close_old_connections

from fleets.base import stopping
from fleets.reconciler.dispatch import dispatch_plan, fleets_provisioned
from fleets.reconciler.provision import fleet_provision_tick
from fleets.reconciler.tick import LEASE_RETRY_SLACK_MS, tick_run

log = logging.getLogger(__name__)


def _always() -> bool:
    return True


class ReconcileLoop:
    """Drive ticks from background threads of this process."""

    def __init__(
        self,
        *,
        interval_ms: int,
        fleets: list[str] | None = None,
        workers: int = 4,
        periodic: Callable[[], bool] | None = None,
    ) -> None:
        self.interval_s = interval_ms / 1000
        self.selection = list(fleets or [])
        # Whether to tick every fleet each interval now (default: always). While it says no,
        # only requested fleets (kicks) and their nudges are ticked: a server whose Celery does
        # the beat, or a server worker that only drives what it kicked (`driver.py`).
        self._periodic = periodic or _always
        self._cond = threading.Condition()
        self._due: dict[str, float] = {}
        # (due, fleet) for every due time set, the earliest first: the loop pops what is due
        # instead of walking every fleet at each wake-up (at 1,000 fleets, 200 wake-ups a
        # second, that walk was a sixth of the loop's process CPU). An entry whose time is no
        # longer the fleet's `_due` is stale and dropped when it comes up.
        self._heap: list[tuple[float, str]] = []
        self._running: set[str] = set()
        # Fleets whose next tick was asked for (a kick, a waiting step's nudge): never deferred
        # by the periodic plan, which only spaces out the periodic ticks.
        self._asked: set[str] = set()
        self._stopping = False
        self._next_refresh = 0.0
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="haru-tick")
        # Provisioning calls the `sky` CLI (seconds to minutes): its own threads, so a slow
        # cloud never delays a fleet's heartbeats or failover.
        self._provision_pool = ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="haru-provision"
        )
        self._provisioning: set[str] = set()
        # The fleets with a domain Haru provisions itself, re-read with every periodic plan:
        # only those get a provisioning pass after their tick (the others' pass finds nothing
        # to do, at the cost of a lease and two queries per tick; as Celery's beat does).
        self._managed: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="haru-reconcile-loop", daemon=True)

    def start(self) -> ReconcileLoop:
        """Start the loop thread (`kick.drive(kick.TickDriver(loop.request))` routes kicks here)."""
        self._thread.start()
        log.info(
            "reconcile loop started: every %d ms, fleets: %s",
            int(self.interval_s * 1000),
            ", ".join(self.selection) or "all",
        )
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop scheduling and wait for running ticks (each is bounded) to finish."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._provision_pool.shutdown(wait=True, cancel_futures=True)

    def wake(self) -> None:
        """Re-read the periodic gate now (it just opened): tick every fleet without waiting."""
        with self._cond:
            self._next_refresh = 0.0
            self._cond.notify_all()

    def request(self, fleet_id: str, delay_ms: int = 0) -> None:
        """Tick `fleet_id` within `delay_ms` (sooner if it was due sooner anyway)."""
        when = time.monotonic() + delay_ms / 1000
        with self._cond:
            self._set_due(fleet_id, min(self._due.get(fleet_id, when), when))
            self._asked.add(fleet_id)
            self._cond.notify_all()

    def _refresh(self) -> None:
        try:
            plan = dispatch_plan(self.selection, interval_s=self.interval_s)
            managed = set(fleets_provisioned(plan.ids()))
        except Exception:  # noqa: BLE001 - the state store may be down; try again next round
            log.warning("reconcile loop: cannot list fleets", exc_info=True)
            return
        finally:
            close_old_connections()
        now = time.monotonic()
        ids = set(plan.ids())
        self._managed = managed
        # Held: look again when the lease runs out (a dead holder is taken over then). Ticked a
        # moment ago by another process: one interval after that tick. Both are re-read at the
        # next refresh, so a holder that gives the fleet back early brings it forward again.
        later = {fid: wait_s + LEASE_RETRY_SLACK_MS / 1000 for fid, wait_s in plan.held.items()}
        later |= plan.recent
        with self._cond:
            for fid in plan.now:
                # Deferred at an earlier refresh for a lease since given back: due now.
                if self._due.get(fid, now) > now + self.interval_s and fid not in self._asked:
                    self._set_due(fid, now)
                if fid not in self._due:
                    self._set_due(fid, now)
            for fid, wait_s in later.items():
                if fid not in self._running and fid not in self._asked:
                    self._set_due(fid, now + wait_s)
            for fid in list(self._due):
                if fid not in ids and fid not in self._running:
                    del self._due[fid]
                    self._asked.discard(fid)
            if len(self._heap) > 4 * len(self._due) + 1024:
                # Mostly stale entries (times moved later): keep one per fleet.
                self._heap = [(due, fid) for fid, due in self._due.items()]
                heapq.heapify(self._heap)

    def _set_due(self, fleet_id: str, when: float) -> None:
        """Set when `fleet_id` is due next (called with `_cond` held)."""
        self._due[fleet_id] = when
        heapq.heappush(self._heap, (when, fleet_id))

    def _run(self) -> None:
        while True:
            now = time.monotonic()
            if now >= self._next_refresh:
                if self._periodic():
                    self._refresh()
                self._next_refresh = now + self.interval_s
            with self._cond:
                if self._stopping:
                    return
                if stopping.is_stopping():
                    # The process stops: its ticks would end at once (`tick_run`). Wait for
                    # `stop()`, which the process's shutdown calls after its drain.
                    self._cond.wait(self.interval_s)
                    continue
                now = time.monotonic()
                heap = self._heap
                while heap and heap[0][0] <= now:
                    due, fid = heapq.heappop(heap)
                    if self._due.get(fid) != due:
                        continue  # stale: moved, or the fleet is gone
                    if fid in self._running:
                        # Due again while its tick runs: that tick's end sets it (`_tick`).
                        continue
                    del self._due[fid]
                    periodic = fid not in self._asked
                    self._asked.discard(fid)
                    self._running.add(fid)
                    self._pool.submit(self._tick, fid, periodic)
                until = min(self._next_refresh, heap[0][0]) if heap else self._next_refresh
                self._cond.wait(max(0.0, until - time.monotonic()))

    def _tick(self, fleet_id: str, periodic: bool = False) -> None:
        beat = self._periodic()
        delay: float | None = self.interval_s if beat else None
        nudged = False
        try:
            # The beat's own ticks pass over a fleet another worker ticked a moment ago; a kick
            # or a waiting step's nudge never does.
            result = tick_run(
                fleet_id=fleet_id, periodic_s=self.interval_s if periodic and beat else None
            )
            # Ran: a step waits. Skipped: look again when the holder's lease runs out, or one
            # interval after the other worker's tick; a periodic tick skipped stays periodic,
            # a kick skipped stays a kick.
            if result.nudge_ms is not None:
                nudge = result.nudge_ms / 1000
                delay = nudge if delay is None else min(delay, nudge)
                nudged = result.ran or not periodic
        except Exception:  # noqa: BLE001 - one fleet's failure must not stop the loop
            log.exception("reconcile tick of fleet %s failed", fleet_id)
        finally:
            close_old_connections()
            # Provisioning follows the beat, not a kick, and only where a domain is managed.
            if fleet_id in self._managed and beat:
                self._provision_start(fleet_id)
            with self._cond:
                self._running.discard(fleet_id)
                if delay is not None:
                    when = time.monotonic() + delay
                    self._set_due(fleet_id, min(self._due.get(fleet_id, when), when))
                    if nudged and delay < self.interval_s:
                        self._asked.add(fleet_id)  # a nudge, not the periodic beat
                elif fleet_id in self._due:
                    # Asked for while it ran (its entry was passed over then): due now.
                    heapq.heappush(self._heap, (self._due[fleet_id], fleet_id))
                self._cond.notify_all()

    def _provision_start(self, fleet_id: str) -> None:
        with self._cond:
            if fleet_id in self._provisioning or self._stopping or stopping.is_stopping():
                return
            self._provisioning.add(fleet_id)
        try:
            self._provision_pool.submit(self._provision, fleet_id)
        except RuntimeError:  # shut down meanwhile
            with self._cond:
                self._provisioning.discard(fleet_id)

    def _provision(self, fleet_id: str) -> None:
        try:
            fleet_provision_tick(fleet_id=fleet_id)
        except Exception:  # noqa: BLE001 - one fleet's failure must not stop the loop
            log.exception("provisioning pass of fleet %s failed", fleet_id)
        finally:
            close_old_connections()
            with self._cond:
                self._provisioning.discard(fleet_id)
