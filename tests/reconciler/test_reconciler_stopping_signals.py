"""Who marks a process stopping, first thing on SIGTERM or SIGINT, and who reads it besides the
tick (tests/reconciler/test_reconciler_stopping.py): the server (before its drain), the
`serve --workers` parent, a Celery worker (its pool children included), the loop and the data
path's reports."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest
import uvicorn
from celery.signals import worker_init, worker_shutting_down
from django.core.management import call_command

from fleets import tasks  # noqa: F401 - connects the Celery receivers under test
from fleets.base import stopping
from fleets.proxy.drain import DRAIN
from fleets.reconciler import datapath, kick
from fleets.reconciler.dispatch import DispatchPlan
from fleets.reconciler.loop import ReconcileLoop
from fleets.server.shutdown import StoppingServer


@pytest.fixture(autouse=True)
def _not_stopping():
    stopping.reset()
    yield
    stopping.reset()


def test_the_server_marks_the_process_stopping_on_its_first_signal(monkeypatch):
    monkeypatch.setattr(DRAIN, "draining", False)
    server = StoppingServer(uvicorn.Config(app="haru.asgi:application"))
    monkeypatch.setattr(uvicorn.Server, "handle_exit", lambda *_args: None)

    server.handle_exit(signal.SIGTERM, None)

    assert stopping.is_stopping()


def test_handlers_in_place_keep_their_meaning_and_mark_stopping_first():
    # The `serve --workers N` parent: uvicorn's supervisor installed its handlers; ours wraps
    # them (fleets/management/commands/serve.py).
    seen: list[tuple[int, bool]] = []
    previous = signal.signal(
        signal.SIGUSR2, lambda sig, _frame: seen.append((sig, stopping.is_stopping()))
    )
    try:
        stopping.mark_first_on([signal.SIGUSR2])
        signal.raise_signal(signal.SIGUSR2)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert seen == [(signal.SIGUSR2, True)]


def test_a_celery_worker_shutting_down_stops_its_ticks():
    worker_shutting_down.send(sender="worker@test", sig="SIGTERM", how="Warm", exitcode=0)
    assert stopping.is_stopping()


def _child_sees_the_stop(ready, done) -> None:
    ready.set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if stopping.is_stopping():
            done.set()
            return
        time.sleep(0.01)


def test_a_pool_child_sees_its_parent_begin_to_stop():
    # A prefork worker's tick runs in a child forked at pool start; the stop signal goes to the
    # parent (systemd's KillMode=mixed). The worker shares the flag before it forks.
    worker_init.send(sender=None)
    fork = multiprocessing.get_context("fork")
    ready, done = fork.Event(), fork.Event()
    child = fork.Process(target=_child_sees_the_stop, args=(ready, done))
    child.start()
    try:
        assert ready.wait(10)
        stopping.begin()
        assert done.wait(10)
    finally:
        child.join(10)


def test_the_loop_starts_no_tick_while_the_process_stops(monkeypatch):
    ticked: list[str] = []
    monkeypatch.setattr(
        "fleets.reconciler.loop.tick_run", lambda **kw: ticked.append(kw["fleet_id"])
    )
    monkeypatch.setattr(
        "fleets.reconciler.loop.fleet_provision_tick",
        lambda **kw: ticked.append(f"provision {kw['fleet_id']}"),
    )
    monkeypatch.setattr(
        "fleets.reconciler.loop.dispatch_plan", lambda _sel, **_kw: DispatchPlan(now=["f1"])
    )
    stopping.begin()
    loop = ReconcileLoop(interval_ms=20).start()
    try:
        loop.request("f2")
        time.sleep(0.3)
    finally:
        loop.stop()
    assert ticked == []


def test_a_stopping_server_reports_no_refused_connection(monkeypatch):
    kicks: list[tuple] = []
    kick.drive(kick.TickDriver(lambda *a: kicks.append(a), lambda *a: kicks.append(a)))
    try:
        stopping.begin()
        datapath.report_unreachable("fleet", "domain", "qwen-small", time.time())
    finally:
        kick.drive(None)
    assert kicks == []


class _IdleLoop:
    def __init__(self, **_kwargs) -> None:
        pass

    def start(self) -> _IdleLoop:
        return self

    def request(self, *_args) -> None:
        pass

    def stop(self) -> None:
        pass


def test_reconcile_loop_command_marks_stopping_on_its_signal(monkeypatch):
    monkeypatch.setattr("fleets.management.commands.reconcile.ReconcileLoop", _IdleLoop)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        call_command("reconcile", "--loop", "--interval-ms", "100")
    finally:
        timer.cancel()
        for sig, handler in before.items():
            signal.signal(sig, handler)
        kick.drive(None)
    assert stopping.is_stopping()
