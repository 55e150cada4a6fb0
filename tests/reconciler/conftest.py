"""Fixtures for the reconciler's unit tests: a seeded fleet, a scripted supervisor, a fake clock."""

from __future__ import annotations

import threading

import pytest

from fleets.core.heartbeat_cadence import standby_every
from fleets.models import Domain
from fleets.reads.selectors import fleet_view
from fleets.reconciler.supervisor import peers, transport
from fleets.reconciler.tick import fleet_tick
from tests.reconciler.fakes import standby_posture_fleet


@pytest.fixture(autouse=True)
def _unlearned():
    """Every test starts knowing nothing of any supervisor's features."""
    peers.forget_features()
    yield
    peers.forget_features()


@pytest.fixture
def hosts():
    """Route every supervisor call to scripted hosts (east active, west standby)."""
    fake = standby_posture_fleet()
    previous = transport.use_transport(fake.transport())
    yield fake
    transport.use_transport(previous)


@pytest.fixture
def fleet(fake_clock, seeded_fleet, hosts):
    """The demo fleet, seeded under the fake clock, with scripted supervisors."""
    return seeded_fleet


@pytest.fixture
def tick(fleet):
    """Return a function running one bare tick of the demo fleet (no in-tick polling)."""

    def run(**kwargs):
        kwargs.setdefault("poll_s", 0)
        return fleet_tick(fleet_id=fleet.id, **kwargs)

    return run


@pytest.fixture
def standby_due(fleet, fake_clock):
    """Move the fake clock on until a healthy standby is asked again: an idle fleet asks it
    every `standbyHeartbeatMs`, not every tick (fleets.core.heartbeat_cadence)."""

    def advance() -> None:
        fake_clock.advance(seconds=standby_every(fleet_view(fleet).policy).total_seconds())

    return advance


@pytest.fixture
def domains(fleet):
    def get():
        return {d.slug: d for d in Domain.objects.filter(fleet=fleet)}

    return get


@pytest.fixture
def ticking_clock(fake_clock):
    """Move the fake clock forward on its own (50 ms every 10 ms, one writer) while a test's
    threads run: a promotion waits for time to pass after its switch before it sleeps the old
    active, and threads that only tick would otherwise wait forever."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(0.01):
            fake_clock.advance(ms=50)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield fake_clock
    stop.set()
    thread.join(5)
