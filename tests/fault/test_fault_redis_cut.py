"""Redis cut while a tick runs during a promotion's wake: the workers live on and reconcile.

Found by the fault suite (issue 29): a worker running a task when Redis went away exited once
Redis returned ("Unrecoverable error: AttributeError('NoneType' object has no attribute
'hostname')"), from the late acknowledgement of that task through the connection Celery had
dropped (haru/celery_consumer.py, docs/upstream.md). With both workers gone nothing reconciled:
an active-host crash afterwards went undetected until a worker was restarted by hand.

Each round promotes to the standby with a wake that hangs, catches a worker's pool process in
the middle of a tick (it holds the fleet's lease), and cuts Redis while that tick runs (the
process is frozen for the instant of the cut, so the tick is in flight whatever the machine's
pace). Redis comes back, the wake is let go, the promotion finishes, and both workers are still
the processes that started and still tick. After the last round the active is crashed, and the
failover it needs must be started within the usual detection time: reconciliation went on.

The target (issue 29) is 10 rounds of 15 s, the crash 10 s after Redis returns:

    HARU_FAULT_REDIS_CUTS=10 HARU_FAULT_REDIS_CUT_S=15 HARU_FAULT_CRASH_AFTER_S=10 \\
        make test-fault PYTEST_ARGS='-k redis_cut'

CI runs two short rounds (the defaults below). A round ends a worker running the old consumer
only when Celery's clean-up of the lost connection failed in the worker whose tick was in
flight (about one round in four here, 1 of 3 in the run that reproduced it);
tests/fault/test_fault_broker_loss.py builds that state on purpose.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime

import pytest

from tests.e2e.harness import wait_for
from tests.fault.cluster import INTERVAL_MS, Deployment, pid_of
from tests.fault.conftest import figure

pytestmark = [pytest.mark.fault, pytest.mark.integration]

ROUNDS = int(os.environ.get("HARU_FAULT_REDIS_CUTS", "2"))
CUT_S = float(os.environ.get("HARU_FAULT_REDIS_CUT_S", "4"))
CRASH_AFTER_S = float(os.environ.get("HARU_FAULT_CRASH_AFTER_S", "3"))
# The wake hangs until the round lets it go; heartbeatStaleMs is FAST_POLICY's 1.5 s.
POLICY = {"wakeTimeoutMs": 120_000, "sleepTimeoutMs": 1500}
STALE_S = 1.5
# Detection of a dead active: stale after heartbeatStaleMs, seen at the next tick (a beat
# interval), plus a loaded CI machine. Without workers it was never seen (40 s and more).
DETECTION_BOUND_S = STALE_S + INTERVAL_MS / 1000 + 3.0


def _cut_redis_mid_tick(d: Deployment) -> None:
    """Stop Redis while a worker's pool process is in the middle of a tick (it holds the lease)."""
    worker_pids = {p.pid for p in d.workers.values()}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        holder = d.lease_holder()
        pid = pid_of(holder) if holder else None
        if pid is None or pid in worker_pids or pid == d.server.proc.pid:  # type: ignore[union-attr]
            time.sleep(0.01)  # no tick running, or a main process (the server's fallback loop)
            continue
        os.kill(pid, signal.SIGSTOP)
        try:
            if d.lease_holder() == holder:  # still in that tick: cut under it
                d.redis.stop()
                return
        finally:
            os.kill(pid, signal.SIGCONT)
    raise AssertionError("never caught a worker in the middle of a tick")


def _one_round(d: Deployment, number: int, target: str) -> float:
    """Promote to `target` with Redis cut mid-wake; return when Redis came back (monotonic)."""
    host = d.west if target == "west" else d.east
    host.fault("qwen-small", wakeHangs=True)
    op_id = d.promote(target)
    wait_for(lambda: d.operation(op_id)["step"] == "wake", 30, "the wake step", every=0.05)
    # Workers hold unacknowledged ETA ticks too, as whenever a step waits: the state in which
    # Celery's clean-up of the lost connection fails and closes the running task's channel.
    d.hold_eta_ticks(4)
    _cut_redis_mid_tick(d)
    cut_at = time.monotonic()
    time.sleep(CUT_S)
    done = {name: d.tasks_done(name) for name in d.workers}
    d.redis.start()
    back_at = time.monotonic()
    figure(f"redis cut {number}: seconds Redis was away", back_at - cut_at)
    host.fault("qwen-small", wakeHangs=False)
    wait_for(lambda: d.operation(op_id)["state"] == "succeeded", 60, f"promotion {number}")
    for name, proc in d.started.items():
        assert proc.poll() is None, f"{name} exited ({proc.returncode}) after Redis cut {number}"
    for name, count in done.items():
        # Each worker takes a tick from the broker again and finishes it: it reconnected.
        wait_for(lambda n=name, c=count: d.tasks_done(n) > c, 30, f"{name} ticking after cut")
    figure(f"redis cut {number}: seconds until both workers ticked", time.monotonic() - back_at)
    return back_at


def test_redis_cut_mid_wake_leaves_the_workers_reconciling(deploy):
    d = deploy(POLICY)
    revision = d.revision()
    back_at = 0.0
    for number in range(1, ROUNDS + 1):
        back_at = _one_round(d, number, "west" if number % 2 else "east")
    assert "Unrecoverable error" not in "".join(d.log(name) for name in d.workers)
    active = d.active_slug()
    figure("redis cut: rounds with every worker alive after", ROUNDS, f"of {ROUNDS}")

    # The server's own fallback loop ticks only while the broker is down: with Redis back, a
    # failover is started by a worker or by no one.
    time.sleep(max(0.0, CRASH_AFTER_S - (time.monotonic() - back_at)))
    crashed = datetime.now(UTC)
    (d.west if active == "west" else d.east).crash()
    wait_for(lambda: _failover_started(d), 30, "the failover of the crashed active", every=0.05)
    detected_s = (_failover_started(d) - crashed).total_seconds()
    figure("redis cut: seconds from the active's crash until its failover started", detected_s)
    wait_for(lambda: d.revision() == revision + ROUNDS + 1, 30, "routing moved off the dead host")
    routed_s = (datetime.now(UTC) - crashed).total_seconds()
    figure("redis cut: seconds from the active's crash until routing moved (at most)", routed_s)
    assert detected_s <= DETECTION_BOUND_S, detected_s
    assert d.active_slug() != active
    wait_for(lambda: all(o[2] == "succeeded" for o in d.operations()), 30, "the failover's end")
    d.assert_invariants(promotions=ROUNDS + 1)


def _failover_started(d: Deployment) -> datetime | None:
    rows = d.q(
        "SELECT created_at FROM fleets_operation WHERE reason = 'auto_failover' "
        "ORDER BY created_at DESC LIMIT 1"
    )
    return rows[0][0] if rows else None
