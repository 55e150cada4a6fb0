"""Per-arm samples of split requests: counted in memory per process, stored once a second.

Every request of a split model (fleets/proxy/split.py) ends with one `record`: its arm, whether
it failed there, its time to first token and its inter-token gaps. They are summed in memory
into one small log-bucket histogram pair (fleets/core/latency_histogram.py) per (rollout,
model, arm, second); a thread of this process's own wakes every FLUSH_S, takes what was summed
and writes it (fleets/services/arm_samples.py) on a connection of its own, so neither the
requests nor the routing reads on the proxy's database thread ever wait for it. The same flush
writes the per-arm Prometheus series (fleets/metrics/arms.py).

The same thread stores when an adapter version first served a user token
(`first_served`, AdapterVersion.first_served_at: the freshness figure's end), once per version.

Fails open: a write that fails (the store down, refused, slow past its timeout) drops those
samples and counts them (`haru_proxy_arm_samples_dropped{reason="store"}`); traffic never
notices. Bounded: at most MAX_WINDOWS windows pending (past them a sample is dropped and
counted, reason "full"), at most MAX_GAPS gaps per request.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from django.db import connections

from fleets.core import latency_histogram as hist
from fleets.metrics import arms as arm_metrics
from fleets.proxy.adapters import first_served_write
from fleets.services.arm_samples import MAX_ROWS, ArmSampleRow, arm_samples_write

log = logging.getLogger("haru.proxy")

FLUSH_S = 1.0
MAX_WINDOWS = MAX_ROWS
MAX_GAPS = 4096
LOG_EVERY_S = 10.0

Key = tuple[str, str, str, int]  # rollout id, model, arm, second (unix)


class _Window:
    __slots__ = ("fleet", "requests", "errors", "ttft", "itl")

    def __init__(self, fleet: str) -> None:
        self.fleet = fleet
        self.requests = 0
        self.errors = 0
        self.ttft: dict[int, int] = {}
        self.itl: dict[int, int] = {}


Writer = Callable[[Sequence[ArmSampleRow], datetime], object]
Served = tuple[str, str, int]  # fleet id, adapter name, version
# Versions known to be marked (in this process), and marks pending: bounded, since every
# version ever served passes through them (a full set forgets; the write is idempotent).
MAX_SERVED = 4096


def _served_write(marks: Sequence[tuple[Served, datetime]]) -> object:
    try:
        return first_served_write(marks)
    except Exception:
        connections["default"].close()
        raise


def _store_write(rows: Sequence[ArmSampleRow], now: datetime) -> object:
    try:
        return arm_samples_write(rows, now=now)
    except Exception:
        # A broken connection is dropped, so the next flush connects afresh.
        connections["default"].close()
        raise


class ArmRecorder:
    """One process's per-arm sums, and the thread that stores them."""

    def __init__(
        self,
        *,
        write: Writer = _store_write,
        now: Callable[[], float] = time.time,
        autostart: bool = True,
        mark: Callable[[Sequence[tuple[Served, datetime]]], object] = _served_write,
    ) -> None:
        self._write = write
        self._mark = mark
        self._served: dict[Served, float] = {}  # pending: version -> when it first served
        self._marked: set[Served] = set()
        self._now = now
        self._autostart = autostart
        self._lock = threading.Lock()
        self._pending: dict[Key, _Window] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._logged = -LOG_EVERY_S
        self.dropped = 0  # samples dropped since start (store failures and overflow)
        self.stored = 0  # rows written

    def record(
        self,
        *,
        fleet: str,
        rollout_id: str,
        model: str,
        arm: str,
        ok: bool,
        ttft_s: float | None = None,
        gaps_s: Sequence[float] = (),
    ) -> None:
        """Count one request of a split model on `arm` (called once its response is done)."""
        key = (rollout_id, model, arm, int(self._now()))
        with self._lock:
            window = self._pending.get(key)
            if window is None:
                if len(self._pending) >= MAX_WINDOWS:
                    self.dropped += 1
                    arm_metrics.dropped("full", 1)
                    return
                window = self._pending[key] = _Window(fleet)
            window.requests += 1
            if not ok:
                window.errors += 1
            if ttft_s is not None:
                hist.add(window.ttft, ttft_s * 1000)
            for gap in gaps_s[:MAX_GAPS]:
                hist.add(window.itl, gap * 1000)
        if self._autostart and self._thread is None:
            self.start()

    def first_served(self, version: Served) -> None:
        """An adapter version served a user token: stored by the next flush unless this
        process stored it already (one dict lookup when it did)."""
        if version in self._marked or version in self._served:
            return
        with self._lock:
            if len(self._served) < MAX_SERVED:
                self._served.setdefault(version, self._now())
        if self._autostart and self._thread is None:
            self.start()

    def _flush_served(self) -> None:
        with self._lock:
            served, self._served = self._served, {}
        if not served:
            return
        marks = [(version, datetime.fromtimestamp(at, UTC)) for version, at in served.items()]
        try:
            self._mark(marks)
        except Exception as exc:  # noqa: BLE001 - fail open: kept for the next flush
            with self._lock:
                for version, at in served.items():
                    if len(self._served) < MAX_SERVED:
                        self._served.setdefault(version, at)
            now = time.monotonic()
            if now - self._logged >= LOG_EVERY_S:  # an outage fails every flush: rate-limited
                self._logged = now
                log.warning(
                    "adapter first-served marks not stored yet (%s); kept for the next flush",
                    type(exc).__name__,
                )
            return
        if len(self._marked) + len(served) > MAX_SERVED:
            self._marked.clear()
        self._marked.update(served)

    def take(self) -> dict[Key, _Window]:
        with self._lock:
            pending, self._pending = self._pending, {}
        return pending

    def flush(self) -> int:
        """Store what was summed since the last flush; return the rows written (0 when the
        write failed: those samples are dropped and counted)."""
        self._flush_served()
        pending = self.take()
        if not pending:
            return 0
        arm_metrics.observe(
            ((w.fleet, model, arm), w.requests, w.errors, w.ttft, w.itl)
            for (_, model, arm, _), w in pending.items()
        )
        rows = [
            ArmSampleRow(
                rollout_id=rollout_id,
                model=model,
                arm=arm,
                window_start=datetime.fromtimestamp(second, UTC),
                requests=w.requests,
                errors=w.errors,
                ttft=hist.sparse(w.ttft),
                itl=hist.sparse(w.itl),
            )
            for (rollout_id, model, arm, second), w in pending.items()
        ]
        try:
            self._write(rows, datetime.fromtimestamp(self._now(), UTC))
        except Exception as exc:  # noqa: BLE001 - fail open: any store fault drops the samples
            lost = sum(w.requests for w in pending.values())
            self.dropped += lost
            arm_metrics.dropped("store", lost)
            now = time.monotonic()
            if now - self._logged >= LOG_EVERY_S:  # an outage fails every flush: rate-limited
                self._logged = now
                log.warning(
                    "per-arm samples dropped (%d requests): the state store failed the write "
                    "(%s); traffic is not affected",
                    lost,
                    type(exc).__name__,
                )
            return 0
        self.stored += len(rows)
        return len(rows)

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name="haru-proxy-arm-stats", daemon=True
            )
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread after one last flush (waiting at most 5 s for it); a later record
        starts it again."""
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=5)
        self._thread = None

    def _run(self) -> None:
        from fleets.proxy.store import own_connection  # noqa: PLC0415 - no cycle at import

        own_connection()
        try:
            while not self._stop.wait(FLUSH_S):
                self.flush()
            self.flush()
        finally:
            connections["default"].close()


RECORDER = ArmRecorder()
# At exit, the last second's samples are stored too (bounded: `stop` waits at most 5 s).
atexit.register(RECORDER.stop)
