"""A flapping active and a partitioned supervisor against a whole deployment (issue 29).

Both under chat load with no client retries, on PostgreSQL, Redis, two Celery workers and beat
(tests/fault/cluster.py), with the launcher's fast policy (heartbeatStaleMs 1.5 s,
degradedGraceMs 3 s) and the flap damping defaults (2 failovers in 10 minutes, then a 30 s
hold-down). Scaled down from the targets, which `bench/flap_partition.py` runs at full size:

- the active's whole host (supervisor and model servers) killed and restarted every 5 s for
  40 s, whichever domain is active at the time: at most 2 failovers, and no chat request fails
  but those in flight at a kill (a SIGKILLed server cannot answer them, docs/proxy-hold.md);
- the control plane cut off from the active's supervisor for 15 s (five times the grace), then
  the supervisor answering later than its deadline for 8 s, while its model servers serve: no
  failover, no failed chat request, and the fleet says why it holds.
"""

from __future__ import annotations

import time

import pytest

from haru.local.processes import wait_for
from tests.fault.chat_load import failures, in_flight_at
from tests.fault.cluster import Deployment
from tests.fault.conftest import figure
from tests.fault.test_fault_suite import _assert_chat_ran_through, _chat_failed, _revision_figure

pytestmark = [pytest.mark.fault, pytest.mark.integration]

FLAP_EVERY_S = 5.0
FLAP_FOR_S = 40.0
PARTITION_S = 15.0
SLOW_S = 8.0
# Longer than the heartbeat's deadline under the fast policy (heartbeatStaleMs / 2: 0.75 s).
SLOW_ANSWER_S = 2.0


def _promotions(d: Deployment) -> list[tuple]:
    return [o for o in d.operations() if o[1] == "promote"]


def _events(d: Deployment, kind: str) -> list[dict]:
    return [r[0] for r in d.q("SELECT data FROM fleets_event WHERE kind = %s ORDER BY id", (kind,))]


def test_an_active_flapping_every_5_s_is_failed_over_at_most_twice(deploy):
    d = deploy()
    d.west.boot_awake()  # restarted as the active, it must come back serving
    revision = d.revision()
    load = d.start_chat()
    kills: list[tuple[float, float]] = []
    started = time.monotonic()
    while time.monotonic() - started < FLAP_FOR_S:
        host = d.east if d.active_slug() == "east" else d.west
        at = time.monotonic()
        host.crash()
        kills.append((at, time.monotonic()))
        host.start()
        time.sleep(max(0.0, at + FLAP_EVERY_S - time.monotonic()))
    ended = time.monotonic()
    # The last host back must be served again before the load stops.
    wait_for(lambda: d.heartbeats_in() and not _in_flight(d), 60, "the fleet settled")
    time.sleep(3.0)
    requests = load.stop()

    failovers = [o for o in _promotions(d) if o[3] == "auto_failover"]
    figure("flapping active: kills", len(kills), f"in {ended - started:.0f} s")
    figure("flapping active: failovers", len(failovers), "operations")
    _chat_failed("flapping active", requests)
    cut = [r for at, done in kills for r in failures(in_flight_at(requests, at, done))]
    others = [r for r in failures(requests) if r not in cut]
    figure("flapping active: failed requests in flight at a kill", len(cut), "requests")
    figure("flapping active: failed requests otherwise", len(others), "requests")
    _assert_chat_ran_through(requests, started, ended)
    assert len(kills) >= 7
    assert len(failovers) <= 2, d.operations()
    assert not others, [r.error for r in others]
    _revision_figure("flapping active", d, revision, operations=len(failovers))
    if len(failovers) == 2:
        # Damped from the second one on: a loss after it waits, and says so. The flapping may
        # end with the second failover (a host back within the heartbeat's staleness is never
        # lost: CI saw two failovers and no loss after them), so the active is lost once more
        # here, until the fleet says it waits (well inside the 30 s hold-down).
        if not _events(d, "failover.damped"):
            host = d.east if d.active_slug() == "east" else d.west
            host.crash()
            try:
                wait_for(lambda: bool(_events(d, "failover.damped")), 30, "the damped loss")
            finally:
                host.start()
        damped = _events(d, "failover.damped")
        assert damped[0]["failovers"] == 2 and damped[0]["holdDownMs"] == 30_000
        after = [o[0] for o in _promotions(d) if o[3] == "auto_failover"]
        assert after == [o[0] for o in failovers]  # it waited: no third failover


def _in_flight(d: Deployment) -> bool:
    return any(o[2] in ("pending", "running") for o in d.operations())


def test_a_partitioned_then_slow_supervisor_of_a_serving_active_moves_no_traffic(deploy):
    d = deploy(relay=True)
    assert d.relay is not None
    revision = d.revision()
    load = d.start_chat()

    d.relay.cut()
    cut_at = time.monotonic()
    wait_for(lambda: _state(d, "east") == "degraded", 10, "east degraded", every=0.1)
    time.sleep(max(0.0, cut_at + PARTITION_S - time.monotonic()))
    partition_ops = _promotions(d)
    held = _events(d, "domain.degraded.held")
    d.relay.heal()
    healed_at = time.monotonic()
    wait_for(lambda: _state(d, "east") == "ready", 20, "east ready again", every=0.1)
    back_s = time.monotonic() - healed_at

    d.relay.slow(SLOW_ANSWER_S)
    slow_at = time.monotonic()
    wait_for(lambda: _state(d, "east") == "degraded", 10, "east degraded (slow)", every=0.1)
    time.sleep(max(0.0, slow_at + SLOW_S - time.monotonic()))
    d.relay.heal()
    slow_end = time.monotonic()
    wait_for(lambda: _state(d, "east") == "ready", 20, "east ready after the slow spell")
    requests = load.stop()

    figure("partitioned supervisor: seconds cut off", healed_at - cut_at)
    figure("partitioned supervisor: seconds until ready after the heal", back_s)
    figure("slow supervisor: seconds answering later than its deadline", slow_end - slow_at)
    figure("partitioned or slow supervisor: failovers", len(_promotions(d)), "operations")
    _assert_chat_ran_through(requests, cut_at, healed_at)
    _assert_chat_ran_through(requests, slow_at, slow_end)
    assert not _chat_failed("partitioned or slow supervisor", requests)
    assert partition_ops == [] and _promotions(d) == []
    _revision_figure("partitioned or slow supervisor", d, revision, operations=0)
    # The grace ran out during the partition: held by the data path, and said so once.
    assert len(held) == 1 and held[0]["reason"] == "supervisor unreachable, data path serving"
    assert len(_events(d, "domain.degraded.held")) == 2  # once more for the slow spell
    assert not _events(d, "domain.degraded.escalated")
    assert d.active_slug() == "east"


def _state(d: Deployment, slug: str) -> str:
    return d.q("SELECT state FROM fleets_domain WHERE slug = %s", (slug,))[0][0]
