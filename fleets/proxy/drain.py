"""Graceful restarts: on SIGTERM a replica says not-ready, stops accepting, and drains.

Order, so that a load balancer moves away before anything is refused:
1. SIGTERM: GET /readyz answers 503 at once (GET /healthz, liveness, stays 200); requests keep
   being served as before.
2. After HARU_DRAIN_READY_MS (long enough for the balancer's readiness probe to notice), the
   listener closes and uvicorn's own graceful shutdown begins: idle keep-alive connections close,
   requests in flight run to their end.
3. HARU_DRAIN_BUDGET_MS after the listener closed, requests still held (fleets/proxy/hold.py)
   are answered 503 with Retry-After: never dropped silently. uvicorn waits a little longer for
   those answers to go out; only then is whatever still runs (a long stream) cancelled.
A second SIGTERM or SIGINT during the drain keeps uvicorn's meaning: stop now.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from types import FrameType

import uvicorn

from common.private_apis import WorkerProcess, note_captured_signal, worker_server
from fleets.base.conf import haru_settings
from fleets.proxy.hold import HOLDS

log = logging.getLogger("haru.serve")

READYZ = "/readyz"
# After the drain budget, how long uvicorn still waits for the held requests' 503s to be sent.
ANSWER_GRACE_S = 2.0


class DrainState:
    def __init__(self) -> None:
        self.draining = False


DRAIN = DrainState()


async def readyz(send) -> None:
    """Readiness: 200 while serving, 503 from the first SIGTERM on (no database touched)."""
    status, body = (503, b'{"status":"draining"}') if DRAIN.draining else (200, b'{"status":"ok"}')
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def graceful_config(**kwargs) -> uvicorn.Config:
    """A uvicorn Config whose graceful shutdown outlasts the drain budget."""
    budget_s = haru_settings().drain_budget_ms / 1000
    # uvicorn's annotation says int; it only waits on the value, and fractions of a second count.
    return uvicorn.Config(
        timeout_graceful_shutdown=budget_s + ANSWER_GRACE_S,  # type: ignore[arg-type]
        **kwargs,
    )


class DrainingServer(uvicorn.Server):
    """uvicorn's Server with the readiness step and the held-request budget before its exit."""

    _drain_task: asyncio.Task[None] | None = None

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        loop = getattr(self, "_loop", None)
        if DRAIN.draining or loop is None or sig not in (signal.SIGTERM, signal.SIGINT):
            if DRAIN.draining:
                self.force_exit = True  # asked twice: stop now, as uvicorn does
            super().handle_exit(sig, frame)
            return
        note_captured_signal(self, sig)
        DRAIN.draining = True
        # A signal handler runs between bytecodes of the loop's thread: hand over to the loop.
        loop.call_soon_threadsafe(self._begin)

    def _begin(self) -> None:
        self._drain_task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        ready_s = haru_settings().drain_ready_ms / 1000
        budget_s = haru_settings().drain_budget_ms / 1000
        log.info("draining: /readyz is 503; closing the listener in %.1f s", ready_s)
        await asyncio.sleep(ready_s)
        self.should_exit = True  # uvicorn closes the listener and waits for what runs
        await asyncio.sleep(budget_s)
        if HOLDS.count:
            log.warning("drain budget spent: answering %d held requests 503", HOLDS.count)
        HOLDS.release_all()


class DrainingProcess(WorkerProcess):
    """A uvicorn worker process that runs a DrainingServer (`--workers N`).

    Pickled by reference into each spawned worker, so the worker builds our server class too.
    """

    @property
    def server(self) -> uvicorn.Server:
        return worker_server(self, DrainingServer)
