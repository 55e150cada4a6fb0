"""Per-model health, detection from the data path, and honest timing, tick by tick.

Scripted supervisors and model servers (tests/reconciler/fakes.py) under a fake clock: a
supervisor that dies alone, a neighbour that dies on the slot, a whole host gone (refused
everywhere), a partition (timeouts everywhere), and jittery heartbeats.
"""

from __future__ import annotations

import random

import httpx
import pytest

from fleets import tasks
from fleets.base import clock
from fleets.core.model_health import ServerHealth
from fleets.models import Domain, Event, Fleet, ModelBinding, Operation
from fleets.proxy import snapshots, store
from fleets.reads.shapes import model_json
from fleets.reconciler import datapath, kick
from fleets.reconciler.steps import promote
from fleets.reconciler.supervisor import transport
from fleets.services.operations import operation_request
from fleets.services.unreachable import UNREACHABLE

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_registry():
    datapath._registry.cache_clear()
    yield
    datapath._registry.cache_clear()


def routes(fleet) -> tuple[list[str], dict[str, str]]:
    """What the proxy would route now: (available models, unavailable -> why)."""
    rows = store.snapshot_rows_read(str(fleet.id))
    snap = snapshots.snapshot_build(rows, loaded_at=0.0)
    return snap.available, snap.unavailable


def health(domain) -> dict[str, str]:
    return dict(ModelBinding.objects.filter(domain=domain).values_list("name", "health"))


def set_policy(fleet, **keys) -> None:
    fleet.policy = {**fleet.policy, **keys}
    fleet.save(update_fields=["policy"])


def test_only_the_supervisor_dead_keeps_serving_and_never_fails_over_on_staleness(
    fleet, tick, hosts, domains, fake_clock
):
    set_policy(fleet, autoFailover=False)
    tick()
    east = hosts.hosts["east"]
    east.down, east.servers_down = True, set()  # the supervisor's process only
    tick()
    d = domains()["east"]
    assert d.state == "degraded"  # for control purposes: no promotion to it
    assert health(d) == {"llama-small": "up", "qwen-small": "up"}
    assert routes(fleet) == (["llama-small", "qwen-small"], {})
    for _ in range(60):  # a minute: far past the 3 s stale window
        fake_clock.advance(ms=1000)
        tick()
    assert not Operation.objects.exists()
    assert routes(fleet) == (["llama-small", "qwen-small"], {})
    assert east.calls["health llama-small"] >= 60  # asked directly, every beat


def test_with_auto_failover_a_supervisor_and_a_server_down_escalate_only_after_the_grace(
    fleet, tick, hosts, domains, fake_clock
):
    # The supervisor alone down never escalates (tests/reconciler/test_reconciler_partition.py);
    # with one model server refusing too, the data path fails and the grace decides.
    tick()
    east = hosts.hosts["east"]
    east.down, east.servers_down = True, {"qwen-small"}
    tick()
    fake_clock.advance(ms=4000)  # stale (3 s) but within degradedGraceMs (5 s)
    tick()
    assert not Operation.objects.exists()
    assert routes(fleet)[0] == ["llama-small"]
    fake_clock.advance(ms=1500)
    tick()
    op = Operation.objects.get()
    assert op.reason == "auto_failover"
    assert Event.objects.filter(kind="domain.degraded.escalated").exists()


def test_a_dead_neighbour_is_refused_alone(fleet, tick, hosts, domains, fake_clock):
    tick()
    hosts.hosts["east"].servers_down = {"qwen-small"}  # supervisor alive, one server gone
    fake_clock.advance(ms=1000)
    tick()
    assert health(domains()["east"]) == {"llama-small": "up", "qwen-small": "down"}
    available, unavailable = routes(fleet)
    assert available == ["llama-small"]
    assert "server down" in unavailable["qwen-small"]
    assert Event.objects.filter(kind="model.serving.down", data__model="qwen-small").exists()
    # The API says so too (the fleet snapshot's models).
    shown = model_json(ModelBinding.objects.get(domain=domains()["east"], name="qwen-small"))
    assert (shown["health"], shown["healthAt"]) == ("down", clock.iso(clock.now()))
    hosts.hosts["east"].servers_down = set()
    fake_clock.advance(ms=1000)
    tick()
    assert routes(fleet) == (["llama-small", "qwen-small"], {})


def test_a_gone_host_reported_by_the_data_path_is_failed_at_once_with_honest_timing(
    fleet, tick, hosts, domains, fake_clock
):
    tick()
    last_seen = domains()["east"].last_seen_at
    fake_clock.advance(ms=400)
    hosts.hosts["east"].down = True  # supervisor and model servers: refused
    failed_at = clock.now()
    datapath.report_unreachable(
        str(fleet.id), str(domains()["east"].id), "llama-small", failed_at.timestamp()
    )
    tick()
    assert domains()["east"].state == "failed"
    event = Event.objects.get(kind="domain.failed", data__reason=UNREACHABLE)
    assert event.data["checks"] == 2 and event.data["reported"] is True
    op = Operation.objects.get()
    assert op.reason == "auto_failover"
    # The outage began at the last good heartbeat, earlier than the failed request.
    assert op.detected_at == last_seen
    assert health(domains()["east"]) == {"llama-small": "down", "qwen-small": "down"}


def test_a_failed_request_before_the_last_good_heartbeat_starts_the_outage(
    fleet, tick, hosts, domains, fake_clock
):
    early = clock.now()
    fake_clock.advance(ms=300)
    tick()  # a good heartbeat, after the request already failed
    hosts.hosts["east"].down = True
    datapath.report_unreachable(
        str(fleet.id), str(domains()["east"].id), "qwen-small", early.timestamp()
    )
    fake_clock.advance(ms=200)
    tick()
    op = Operation.objects.get()
    assert op.detected_at == early
    switched = None
    for _ in range(10):
        fake_clock.advance(ms=100)
        tick()
        switched = Event.objects.filter(
            operation=op, kind="operation.step.done", step="switch_route"
        ).first()
        if switched:
            break
    assert switched is not None
    assert switched.data["failoverMs"] == int((switched.created_at - early).total_seconds() * 1000)


def test_a_gone_host_is_confirmed_by_the_heartbeat_itself_without_traffic(
    fleet, tick, hosts, domains
):
    tick()
    hosts.hosts["east"].down = True
    tick()
    assert domains()["east"].state == "failed"
    failed = Event.objects.get(kind="domain.failed", data__reason=UNREACHABLE)
    assert failed.data["reported"] is False


def test_a_partition_keeps_the_stale_window(fleet, tick, hosts, domains, fake_clock):
    tick()
    hosts.hosts["east"].partitioned = True
    datapath.report_unreachable(
        str(fleet.id), str(domains()["east"].id), "llama-small", clock.now().timestamp()
    )
    tick()
    assert domains()["east"].state == "degraded"
    assert not Operation.objects.exists()
    # Timeouts are no news about the model servers: still routed until the window passes.
    assert routes(fleet)[0] == ["llama-small", "qwen-small"]
    fake_clock.advance(ms=3001)
    tick()
    assert Operation.objects.get().reason == "auto_failover"


def test_one_failed_request_to_a_healthy_host_changes_nothing(fleet, tick, hosts, domains):
    tick()
    east = domains()["east"]
    datapath.report_unreachable(str(fleet.id), str(east.id), "llama-small", 1.0)
    tick()
    assert domains()["east"].state == "ready"
    assert not Operation.objects.exists()
    assert not Event.objects.filter(kind="domain.failed").exists()
    assert datapath.first_failed_at(fleet.id, east.id) is None  # not confirmed: forgotten


def test_a_host_that_answers_again_on_the_second_check_is_not_failed(
    fleet, tick, hosts, domains, fake_clock, monkeypatch
):
    tick()
    east = hosts.hosts["east"]
    east.down = True

    def revive(seconds: float) -> None:
        east.down = False  # back between the two checks: a restart, not a dead host
        fake_clock.advance(seconds=seconds)

    monkeypatch.setattr(fake_clock, "sleep", revive)
    datapath.report_unreachable(
        str(fleet.id), str(domains()["east"].id), "llama-small", clock.now().timestamp()
    )
    tick()
    assert domains()["east"].state != "failed"
    assert not Operation.objects.exists()


def test_reports_are_rate_limited_carried_with_their_payload_and_never_raise(
    fleet, domains, fake_clock
):
    seen = []
    kick.drive(kick.TickDriver(kick=lambda *_: None, report=lambda *args: seen.append(args)))
    east = str(domains()["east"].id)
    now = clock.now().timestamp()
    datapath.report_unreachable(str(fleet.id), east, "llama-small", now - 1)
    datapath.report_unreachable(str(fleet.id), east, "qwen-small", now - 2)  # within 200 ms
    assert seen == [(str(fleet.id), east, "llama-small", now - 1)]
    # The earliest failure is kept even when its report was not sent.
    assert datapath.first_failed_at(fleet.id, east).timestamp() == now - 2
    # A time from a skewed clock is bounded: never in the future, never over a minute old.
    datapath._registry.cache_clear()
    datapath.report_unreachable(str(fleet.id), east, "m", now + 3600)
    assert datapath.first_failed_at(fleet.id, east).timestamp() == now
    datapath.report_unreachable(str(fleet.id), east, "m", 1.0)
    assert datapath.first_failed_at(fleet.id, east).timestamp() == now - 60
    kick.drive(kick.TickDriver(kick=lambda *_: None, report=lambda *args: 1 / 0))
    datapath.report_unreachable(str(fleet.id), "other", "m", 1.0)  # swallowed
    datapath.report_unreachable(object(), None, None, "not a time")  # type: ignore[arg-type]


def test_jittery_heartbeats_never_fail_over(fleet, tick, hosts, fake_clock):
    """Answers delayed by up to half the stale window (3 s), for 2 minutes of ticks (the
    10-minute run is `bench/failover_load.py --jitter`)."""
    rng = random.Random(7)
    inner = hosts.transport()

    def slow(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/status":
            fake_clock.advance(ms=rng.uniform(0, 1500))
        return inner.handle_request(request)

    transport.use_transport(httpx.MockTransport(slow))
    for _ in range(120):
        fake_clock.advance(ms=1000)
        tick()
    assert not Operation.objects.exists()
    assert Fleet.objects.get(pk=fleet.pk).route_revision == 1
    assert set(Domain.objects.values_list("state", flat=True)) == {"ready"}
    assert set(
        ModelBinding.objects.filter(domain__slug="east").values_list("health", flat=True)
    ) == {ServerHealth.UP}


def test_a_planned_promotion_sleeps_the_old_active_only_after_proxies_moved_off(
    fleet, tick, hosts, domains, fake_clock, settings
):
    settings.HARU = {**settings.HARU, "chat_hold_poll_ms": 250, "snapshot_cache_ttl_ms": 2000}
    assert promote.switch_settle_ms() == 2250  # the longer bound plus the margin
    tick()
    east = hosts.hosts["east"]
    op = operation_request(fleet=fleet, kind="promote", target_domain_id=domains()["west"].id)
    tick()
    op = Operation.objects.get(pk=op.operation.id)
    assert Fleet.objects.get(pk=fleet.pk).active_domain_id == domains()["west"].id
    assert op.current_step == "demote_old_sleep"
    # The probe proved west's servers: the first snapshot after the switch routes them (its
    # health read down while it slept; no heartbeat has run since).
    assert health(domains()["west"]) == {"llama-small": "up", "qwen-small": "up"}
    assert routes(fleet) == (["llama-small", "qwen-small"], {})

    def sleeps() -> list[str]:
        return [
            url
            for method, url, _ in east.requests
            if url.endswith("/v1/vllm/sleep") or "/v1/vllm/sleep?" in url
        ]

    fake_clock.advance(ms=2200)
    tick()
    assert sleeps() == []  # a proxy may still hold the old pointer: nothing is cut
    assert not any(east.models.values())  # still awake, still serving what it holds
    fake_clock.advance(ms=100)
    tick()
    sent = sleeps()
    assert len(sent) == 1
    assert "waitMs=" in sent[0]  # through the supervisor's drain: running requests finish
    # ... which ends in time for the sleep to fit in what is left of the step.
    assert "budgetMs=" in sent[0]
    assert all(east.models.values())


def test_a_sleep_budget_shorter_than_the_settle_wait_still_sleeps_the_old_active(
    fleet, tick, hosts, domains, fake_clock, settings
):
    """The wait for proxies to move off comes before the sleep and is not the sleep's time."""
    settings.HARU = {**settings.HARU, "chat_hold_poll_ms": 250, "snapshot_cache_ttl_ms": 2000}
    fleet.policy = {**fleet.policy, "sleepTimeoutMs": 1500}
    fleet.save(update_fields=["policy"])
    tick()
    east = hosts.hosts["east"]
    made = operation_request(fleet=fleet, kind="promote", target_domain_id=domains()["west"].id)
    tick()
    for step_ms in (1000, 1000, 300):  # ticks inside the settle wait, past sleepTimeoutMs alone
        fake_clock.advance(ms=step_ms)
        tick()
    op = Operation.objects.get(pk=made.operation.id)
    assert op.state == "succeeded"
    slept = Event.objects.get(
        operation_id=op.id, kind="operation.step.done", step="demote_old_sleep"
    )
    assert slept.data.get("sleepProven") is True, slept.data
    assert all(east.models.values())
    assert Domain.objects.get(pk=domains()["east"].id).state != "degraded"


def test_under_celery_the_report_travels_as_task_arguments_and_the_worker_confirms(
    fleet, hosts, domains, monkeypatch
):
    sent = []
    monkeypatch.setattr(
        tasks.datapath_report, "apply_async", lambda args, **kw: sent.append((args, kw))
    )
    nudges = []
    monkeypatch.setattr(tasks, "celery_kicker", lambda fid, ms: nudges.append((fid, ms)))
    east = str(domains()["east"].id)
    at = clock.now().timestamp()
    tasks.celery_reporter(str(fleet.id), east, "llama-small", at)
    assert sent == [([str(fleet.id), east, "llama-small", at], {"expires": 5.0})]

    # The worker's side: a process that never saw the report notes it, then ticks.
    hosts.hosts["east"].down = True
    answer = tasks.datapath_report.run(*sent[0][0])
    assert answer["ran"] is True
    assert domains()["east"].state == "failed"
    failed = Event.objects.get(kind="domain.failed", data__reason=UNREACHABLE)
    assert failed.data["reported"] is True
    assert Operation.objects.get().reason == "auto_failover"
