"""Whether this process is stopping: marked first thing on SIGTERM or SIGINT, read by every tick.

A control plane that is being stopped (a server draining, a Celery worker in its warm shutdown)
often stops together with its hosts: `make demo`'s Ctrl-C stops the server and both
supervisors at once, and an outage can take a whole rack down. What such a process observes
while it stops (hosts refusing connections) is the stop, not news: a stopping process starts no
operation, moves no domain to failed, and leaves an operation in flight to resume after the
restart (issue 28). The tick reads this at each of its checkpoints (`check`), so a tick already
running when the signal arrives stops at its next one, before it writes what it saw.

The flag is per process. A prefork Celery worker's tick runs in a pool child, while the stop
signal goes to the pool's parent (systemd's `KillMode=mixed`): `share_with_children` gives the
parent a flag in shared memory that the children it forks afterwards read too.
"""

from __future__ import annotations

import logging
import mmap
import signal
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)


class Stopping(Exception):
    """Raised at a tick's checkpoint once this process is stopping: stop, write nothing more."""


class _Flag:
    def __init__(self) -> None:
        # A plain attribute: set from signal handlers, where taking a lock the interrupted
        # thread may hold (an Event's, logging's) could deadlock.
        self.local = False
        # One byte shared with the children forked after `share_with_children` (MAP_SHARED).
        self.shared: mmap.mmap | None = None


_flag = _Flag()


def begin() -> None:
    """Mark this process (and the pool children it shares the flag with) as stopping.

    Safe inside a signal handler: it only sets flags (the tick logs what it then skipped).
    """
    if _flag.shared is not None:
        _flag.shared[0] = 1
    _flag.local = True


def is_stopping() -> bool:
    """Whether this process, or the parent it shares the flag with, is stopping."""
    return _flag.local or (_flag.shared is not None and _flag.shared[0] == 1)


def check() -> None:
    """A checkpoint: raise `Stopping` once this process is stopping."""
    if is_stopping():
        raise Stopping("this process is stopping")


def share_with_children() -> None:
    """Keep the flag in shared memory, so children forked from now on see this process stop."""
    if _flag.shared is None:
        _flag.shared = mmap.mmap(-1, 1)
        if _flag.local:
            _flag.shared[0] = 1


def mark_first_on(signals: Iterable[int]) -> None:
    """Make the handlers installed now for `signals` mark this process stopping before they run.

    For a process whose own stop handling lives in a library (uvicorn's multiprocess
    supervisor): it keeps its meaning, and the ticks of this process stop at once.
    """
    for sig in signals:
        previous = signal.getsignal(sig)
        signal.signal(sig, _marking(previous))


def _marking(previous: Any) -> Callable[[int, FrameType | None], Any]:
    def handler(sig: int, frame: FrameType | None) -> Any:
        begin()
        if callable(previous):
            return previous(sig, frame)
        if previous == signal.SIG_DFL:
            # The default action (terminate) with the default handler back in place.
            signal.signal(sig, signal.SIG_DFL)
            signal.raise_signal(sig)
        return None

    return handler


def reset() -> None:
    """Forget a stop (tests; a process never comes back from stopping)."""
    _flag.local = False
    if _flag.shared is not None:
        _flag.shared[0] = 0
