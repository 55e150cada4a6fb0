"""Who drives reconcile ticks in a server process, with or without a broker.

Without a broker (no REDIS_URL), the server's own loop ticks every fleet each interval.

With a broker, Celery beat and workers tick, and a new operation is queued to them. Failover
must not depend on the broker (issue 11, finding 15), so the server keeps its own loop ready:
- a kick that cannot be queued (Redis down, refused, slow past its bounded timeouts) runs in
  this process at once, and further kicks skip the broker until it answers again;
- a probe pings Redis every `PROBE_EVERY_S`; while it fails, and for `RESUME_GRACE_S` after it
  answers again (Celery beat and workers reconnect in that time, see `haru.celery_consumer`),
  the loop ticks every fleet each interval as it would without a broker.
The fleet's tick lease keeps server and Celery from ticking one fleet at once, so the overlap at
either edge costs a skipped tick, never a duplicate step.

`serve --workers N` (N > 1): the parent process runs the periodic loop (and the probe); every
worker process runs a kick-only loop, so an operation accepted by any worker starts at once in
that worker (its follow-up nudges too), under the same lease. See `start_for_server`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from fleets.base.conf import haru_settings
from fleets.base.setting_table import SetByHaru
from fleets.reconciler import kick
from fleets.reconciler.loop import ReconcileLoop
from fleets.tasks import broker_ping, celery_kicker, celery_reporter

log = logging.getLogger(__name__)

# Set by `serve --workers N` (N > 1) for its worker processes: each starts a kick-only driver.
SERVE_WORKER_ENV = SetByHaru.serve_worker_driver.env
# How often the server asks Redis whether it is there (a PING, bounded by the client's timeouts).
PROBE_EVERY_S = 1.0
# After the broker answers again, the server keeps ticking this long: Celery's worker reconnects
# within about 1 s (bounded backoff) and beat sends at its next interval.
RESUME_GRACE_S = 10.0
# After a failed enqueue, kicks go straight to the loop this long before trying the broker again.
SKIP_BROKER_S = 2.0


class BrokerFallback:
    """Queue ticks to Celery while the broker answers; tick here while it does not."""

    def __init__(
        self,
        *,
        loop: ReconcileLoop,
        enqueue: kick.Kicker,
        probe: Callable[[], bool] | None,
        probe_every_s: float = PROBE_EVERY_S,
        resume_grace_s: float = RESUME_GRACE_S,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.loop = loop
        self._enqueue = enqueue
        self._probe = probe
        self._probe_every_s = probe_every_s
        self._resume_grace_s = resume_grace_s
        self._now = now
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._up_since: float | None = None  # answered again at; None: never down
        self._skip_until = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # The loop's periodic gate.
    def covering(self) -> bool:
        """Whether this process ticks every fleet itself now (broker down, or just back)."""
        with self._lock:
            if self._down_since is not None:
                return True
            return self._up_since is not None and (
                self._now() - self._up_since < self._resume_grace_s
            )

    def kick(self, fleet_id: str, delay_ms: int) -> None:
        """The process's kicker: queue to Celery, or tick here when the broker cannot take it."""
        with self._lock:
            skip = self._down_since is not None or self._now() < self._skip_until
        if not skip:
            try:
                self._enqueue(fleet_id, delay_ms)
                return
            except Exception:  # noqa: BLE001 - any broker failure: the loop takes the tick
                log.warning(
                    "cannot queue a tick of fleet %s: ticking it in this process",
                    fleet_id,
                    exc_info=True,
                )
                self._mark_down()
        self.loop.request(fleet_id, delay_ms)

    def _mark_down(self) -> None:
        with self._lock:
            self._skip_until = self._now() + SKIP_BROKER_S
            if self._probe is None or self._down_since is not None:
                return
            self._down_since = self._now()
        log.error("broker unreachable: this server ticks every fleet until it is back")
        self.loop.wake()

    def _mark_up(self) -> None:
        with self._lock:
            if self._down_since is None:
                return
            outage = self._now() - self._down_since
            self._down_since = None
            self._up_since = self._now()
            self._skip_until = 0.0
        log.warning(
            "broker back after %.1f s: Celery resumes; this server keeps ticking for %.0f s",
            outage,
            self._resume_grace_s,
        )

    def probe_once(self) -> bool:
        assert self._probe is not None
        try:
            ok = self._probe()
        except Exception:  # noqa: BLE001 - unreachable is the answer, not an error
            ok = False
        if ok:
            self._mark_up()
        else:
            self._mark_down()
        return ok

    def start(self) -> BrokerFallback:
        if self._probe is not None:
            self._thread = threading.Thread(
                target=self._watch, name="haru-broker-probe", daemon=True
            )
            self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(self._probe_every_s):
            self.probe_once()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


class Driver:
    """What `start_for_server` started; `stop()` undoes it."""

    def __init__(self, loop: ReconcileLoop | None, fallback: BrokerFallback | None) -> None:
        self.loop = loop
        self.fallback = fallback

    def stop(self) -> None:
        if self.fallback is not None:
            self.fallback.stop()
        if self.loop is not None:
            self.loop.stop()


def _celery_enqueue(fleet_id: str, delay_ms: int) -> None:
    celery_kicker(fleet_id, delay_ms)


def start_for_server(*, role: str = "single") -> Driver:
    """Start this server process's tick driver.

    `role`: "single" (one process serves and ticks), "parent" (`serve --workers N`: ticks every
    fleet each interval, serves nothing) or "worker" (serves, and drives only the ticks it
    kicks).
    """
    interval = haru_settings().reconcile_interval_ms or 5000
    selection = haru_settings().reconcile_fleets
    periodic_here = role in ("single", "parent")
    if not haru_settings().redis_url:
        if not haru_settings().reconcile_interval_ms:
            log.warning(
                "HARU_RECONCILE_INTERVAL_MS is not set and there is no broker: nothing drives "
                "reconcile ticks, so automatic failover is OFF (POST .../reconcile still works)"
            )
            return Driver(None, None)
        loop = ReconcileLoop(
            interval_ms=interval,
            fleets=selection,
            periodic=None if periodic_here else _never,
        )
        loop.start()
        if role != "parent":
            kick.drive(kick.TickDriver(loop.request))
        return Driver(loop, None)
    # With a broker: Celery ticks; this process's loop covers what the broker cannot take.
    gate: list[BrokerFallback] = []
    loop = ReconcileLoop(
        interval_ms=interval,
        fleets=selection,
        periodic=(lambda: gate[0].covering()) if periodic_here else _never,
    )
    fallback = BrokerFallback(
        loop=loop, enqueue=_celery_enqueue, probe=broker_ping if periodic_here else None
    )
    gate.append(fallback)
    loop.start()
    fallback.start()
    kick.drive(kick.TickDriver(fallback.kick, _reporter_via(fallback)))
    log.info(
        "reconcile ticks: Celery (run `celery -A haru worker` and `celery -A haru beat`); this "
        "server ticks while the broker is unreachable"
    )
    return Driver(loop, fallback)


def _reporter_via(fallback: BrokerFallback) -> kick.Reporter:
    """Data-path reports go to a worker with the report as the task's arguments; while the
    broker cannot take them they become a kick of this process's loop, which reads the report
    from this process's registry (fleets.reconciler.datapath noted it before reporting)."""

    def report(fleet_id: str, domain_id: str, model: str, failed_at: float) -> None:
        if fallback.covering():
            kick.fleet_kick(fleet_id, delay_ms=0)
            return
        try:
            celery_reporter(fleet_id, domain_id, model, failed_at)
        except Exception:  # noqa: BLE001 - the broker failed us: confirm here instead
            log.warning("data-path report not queued; confirming in this process", exc_info=True)
            kick.fleet_kick(fleet_id, delay_ms=0)

    return report


def _never() -> bool:
    return False
