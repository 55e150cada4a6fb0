"""The data path decides about a degraded active, and a flapping active is damped, tick by tick.

Scripted supervisors and model servers (tests/reconciler/fakes.py) under a fake clock, with the
demo policy (heartbeatStaleMs 3 s, degradedGraceMs 5 s, autoFailover on): a supervisor that is
dead, partitioned away or slower than its deadline while its model servers serve is degraded
and never escalated; once the data path fails too it is. A fleet that failed over twice lately
waits for its lost active to stay lost before the next failover.
"""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest

from fleets.base import clock
from fleets.core.policy import Policy
from fleets.dashboard.selectors import fleet_page, overview_rows
from fleets.models import Domain, Event, Fleet, ModelBinding, Operation
from fleets.proxy import snapshots, store
from fleets.reconciler import datapath
from fleets.reconciler.heartbeat import heartbeat_timeout
from fleets.reconciler.supervisor import transport
from fleets.services.escalation import ESCALATION_HELD, domain_escalate

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_registry():
    datapath._registry.cache_clear()
    yield
    datapath._registry.cache_clear()


def routes(fleet) -> list[str]:
    rows = store.snapshot_rows_read(str(fleet.id))
    return snapshots.snapshot_build(rows, loaded_at=0.0).available


def ticks(tick, fake_clock, seconds: int) -> None:
    for _ in range(seconds):
        fake_clock.advance(ms=1000)
        tick()


def held_events() -> list[Event]:
    return list(Event.objects.filter(kind=ESCALATION_HELD).order_by("id"))


@pytest.mark.parametrize("fault", ["dead", "partitioned"])
def test_an_unreachable_supervisor_whose_model_servers_serve_is_never_failed_over(
    fleet, tick, hosts, domains, fake_clock, fault
):
    tick()
    east = hosts.hosts["east"]
    if fault == "dead":
        east.down, east.servers_down = True, set()  # the supervisor's process only
    else:
        east.supervisor_partitioned = True  # its calls time out; model servers answer
    ticks(tick, fake_clock, 60)  # twelve times degradedGraceMs, twenty times the stale window
    assert domains()["east"].state == "degraded"
    assert not Operation.objects.exists()
    assert Fleet.objects.get(pk=fleet.pk).route_revision == 1
    assert routes(fleet) == ["llama-small", "qwen-small"]
    assert not Event.objects.filter(kind="domain.degraded.escalated").exists()
    # Said once for the spell, once the grace had run out, with why.
    [held] = held_events()
    assert held.domain_id == domains()["east"].id
    assert held.data["reason"] == "supervisor unreachable, data path serving"
    assert held.data["degradedForMs"] > held.data["graceMs"] == 5000
    assert held.data["supervisorFailingSince"] is not None


def test_a_supervisor_slower_than_its_deadline_is_a_supervisor_unreachable(
    fleet, tick, hosts, domains, fake_clock
):
    # Every status call takes longer than the heartbeat's deadline: the transport gives up at
    # the deadline (httpx's ReadTimeout) while the model servers answer at once.
    tick()
    inner = hosts.transport()
    deadline_ms = heartbeat_timeout(fleet_policy(fleet)) * 1000

    def slow(request: httpx.Request) -> httpx.Response:
        if request.url.port == 8701:
            fake_clock.advance(ms=deadline_ms)
            raise httpx.ReadTimeout("no answer within the deadline", request=request)
        return inner.handle_request(request)

    transport.use_transport(httpx.MockTransport(slow))
    ticks(tick, fake_clock, 30)
    assert domains()["east"].state == "degraded"
    assert not Operation.objects.exists()
    assert routes(fleet) == ["llama-small", "qwen-small"]
    assert len(held_events()) == 1


def fleet_policy(fleet) -> Policy:
    return Policy.resolve(Fleet.objects.get(pk=fleet.pk).policy)


def test_the_data_path_failing_too_escalates_at_once_past_the_grace(
    fleet, tick, hosts, domains, fake_clock
):
    tick()
    east = hosts.hosts["east"]
    east.down, east.servers_down = True, set()
    ticks(tick, fake_clock, 20)
    assert not Operation.objects.exists()
    east.servers_down = {"qwen-small"}  # one model server refuses now: the data path fails
    fake_clock.advance(ms=1000)
    tick()
    assert Event.objects.filter(kind="domain.degraded.escalated").exists()
    assert Operation.objects.get().reason == "auto_failover"


def test_a_supervisor_back_ends_the_spell_and_the_next_one_is_said_again(
    fleet, tick, hosts, domains, fake_clock
):
    tick()
    east = hosts.hosts["east"]
    east.supervisor_partitioned = True
    ticks(tick, fake_clock, 8)
    assert len(held_events()) == 1
    east.supervisor_partitioned = False
    ticks(tick, fake_clock, 2)
    assert domains()["east"].state == "ready"
    east.supervisor_partitioned = True
    ticks(tick, fake_clock, 8)
    assert len(held_events()) == 2
    assert not Operation.objects.exists()


def test_the_escalation_update_rechecks_the_data_path(fleet, tick, hosts, domains, fake_clock):
    # The core's answer can be out of date by the time the UPDATE runs: a heartbeat that saw
    # every model server serving in between wins.
    tick()
    east = domains()["east"]
    Domain.objects.filter(pk=east.pk).update(
        state="degraded", state_updated_at=clock.now() - timedelta(seconds=10)
    )
    ModelBinding.objects.filter(domain=east).update(health="up", serving_seen_at=clock.now())
    kwargs = {"now": clock.now(), "degraded_grace_ms": 5000, "heartbeat_stale_ms": 3000}
    assert not domain_escalate(domain_id=east.pk, **kwargs)
    assert Domain.objects.get(pk=east.pk).state == "degraded"
    # Seen longer ago than the stale window: the data path is no longer evidence.
    ModelBinding.objects.filter(domain=east, name="qwen-small").update(
        serving_seen_at=clock.now() - timedelta(seconds=4)
    )
    assert domain_escalate(domain_id=east.pk, **kwargs)
    assert Domain.objects.get(pk=east.pk).state == "failed"


# --- flap damping -----------------------------------------------------------------------------


def two_recent_failovers(fleet, domains) -> None:
    """Record two automatic failovers committed within the last minutes (east <-> west)."""
    now = clock.now()
    d = domains()
    for n, (source, target) in enumerate([("east", "west"), ("west", "east")]):
        at = now - timedelta(seconds=120 - 60 * n)
        Operation.objects.create(
            fleet=fleet,
            kind="promote",
            state="succeeded",
            reason="auto_failover",
            source_domain=d[source],
            target_domain=d[target],
            routing_committed=True,
            created_at=at,
            started_at=at,
            finished_at=at,
            served_at=at,
        )


def test_a_damped_fleet_waits_for_its_lost_active_to_stay_lost(
    fleet, tick, hosts, domains, fake_clock
):
    two_recent_failovers(fleet, domains)
    tick()
    hosts.hosts["east"].down = True  # the whole host: supervisor and model servers refuse
    datapath.report_unreachable(
        str(fleet.id), str(domains()["east"].id), "llama-small", clock.now().timestamp()
    )
    tick()
    assert domains()["east"].state == "failed"  # confirmed gone, as without damping
    assert not Operation.objects.filter(state="running").exists()
    damped = Event.objects.get(kind="failover.damped")
    assert damped.data["failovers"] == 2
    assert damped.data["holdDownMs"] == 30_000
    assert damped.data["reason"] == "failover_damped"
    lost_at = Domain.objects.get(slug="east").last_seen_at  # the outage's start
    # Each tick confirms the loss again (two checks 200 ms apart): go by the clock.
    while clock.now() < lost_at + timedelta(seconds=29):
        ticks(tick, fake_clock, 1)
    assert Operation.objects.filter(reason="auto_failover").count() == 2  # still the old two
    ticks(tick, fake_clock, 2)  # lost for longer than the hold-down
    newest = Operation.objects.filter(reason="auto_failover").order_by("-created_at").first()
    assert newest.state in ("running", "succeeded") and newest.target_domain.slug == "west"


def test_a_damped_active_back_in_place_is_not_failed_over(fleet, tick, hosts, domains, fake_clock):
    two_recent_failovers(fleet, domains)
    tick()
    east = hosts.hosts["east"]
    for _ in range(4):  # down 4 s, back 6 s: four times
        east.down = True
        ticks(tick, fake_clock, 4)
        east.down = False
        ticks(tick, fake_clock, 6)
    assert Operation.objects.count() == 2
    assert Fleet.objects.get(pk=fleet.pk).route_revision == 1
    assert domains()["east"].state == "ready"


def test_without_recent_failovers_the_same_loss_fails_over_at_once(
    fleet, tick, hosts, domains, fake_clock
):
    tick()
    hosts.hosts["east"].down = True
    datapath.report_unreachable(
        str(fleet.id), str(domains()["east"].id), "llama-small", clock.now().timestamp()
    )
    tick()
    assert Operation.objects.get().reason == "auto_failover"
    assert not Event.objects.filter(kind="failover.damped").exists()


def test_the_metrics_say_damped_and_held_by_the_data_path(
    fleet, tick, hosts, domains, fake_clock, client
):
    tick()
    text = client.get("/metrics").content.decode()
    assert 'haru_fleet_failover_damped{fleet="demo"} 0.0' in text
    assert 'haru_fleet_active_held_by_data_path{domain="east",fleet="demo"} 0.0' in text
    two_recent_failovers(fleet, domains)
    hosts.hosts["east"].supervisor_partitioned = True
    ticks(tick, fake_clock, 2)
    text = client.get("/metrics").content.decode()
    assert 'haru_fleet_failover_damped{fleet="demo"} 1.0' in text
    assert 'haru_fleet_failovers_in_flap_window{fleet="demo"} 2.0' in text
    assert "haru_fleet_failover_damped_until_timestamp_seconds" in text
    assert 'haru_fleet_active_held_by_data_path{domain="east",fleet="demo"} 1.0' in text


def test_the_fleet_page_and_the_overview_say_held_and_damped(
    fleet, tick, hosts, domains, fake_clock
):
    tick()
    hosts.hosts["east"].supervisor_partitioned = True
    ticks(tick, fake_clock, 2)
    page = fleet_page(fleet, now=clock.now())
    assert page["health"] == "warn"
    [held] = page["health_reasons"]
    assert held.startswith("active east degraded: supervisor unreachable, data path serving (")
    assert "not failed over while its model servers serve" in held

    two_recent_failovers(fleet, domains)
    page = fleet_page(fleet, now=clock.now())
    damped = page["health_reasons"][0]
    assert damped.startswith("failovers damped: 2 automatic failovers in the last 10m 00s")
    assert "waits for the active to stay lost 30.0s" in damped
    until = (clock.now() - timedelta(seconds=120) + timedelta(minutes=10)).strftime("%H:%M:%S")
    assert f"backing off until {until} UTC" in damped
    [row] = overview_rows(now=clock.now())
    assert row["health_reasons"][:2] == page["health_reasons"][:2]


def test_the_api_says_damped_until_when(fleet, tick, domains, client, fake_clock):
    tick()
    assert client.get("/v1/fleets/demo").json()["failoverDamping"] is None
    two_recent_failovers(fleet, domains)
    damping = client.get("/v1/fleets/demo").json()["failoverDamping"]
    assert damping == {
        "failovers": 2,
        "windowMs": 600_000,
        "holdDownMs": 30_000,
        "lastFailoverAt": clock.iso(clock.now() - timedelta(seconds=60)),
        "until": clock.iso(clock.now() - timedelta(seconds=120) + timedelta(minutes=10)),
    }
