"""The server's shutdown: the proxy's drain (`fleets.proxy.drain`), with this process's
reconcile ticks stopped before anything else.

The first SIGTERM or SIGINT marks the process stopping (`fleets.base.stopping`): the drain then
runs as before (readiness off, the listener closed, held requests answered), while the reconcile
loop of this process ticks no more. Its hosts may be stopping with it (`make demo`'s Ctrl-C, a
rack going down), and their refused connections are the stop, not an outage to fail over from.
`manage.py serve` runs `StoppingServer`, and `StoppingProcess` for each `--workers N` worker.
"""

from __future__ import annotations

import signal
from types import FrameType

import uvicorn

from common.private_apis import worker_server
from fleets.base import stopping
from fleets.proxy.drain import DrainingProcess, DrainingServer


class StoppingServer(DrainingServer):
    """A draining server whose first stop signal stops this process's ticks at once."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig in (signal.SIGTERM, signal.SIGINT):
            stopping.begin()
        super().handle_exit(sig, frame)


class StoppingProcess(DrainingProcess):
    """A `--workers N` worker process that runs a StoppingServer (pickled by reference into
    each spawned worker, so the worker builds this class too)."""

    @property
    def server(self) -> uvicorn.Server:
        return worker_server(self, StoppingServer)
