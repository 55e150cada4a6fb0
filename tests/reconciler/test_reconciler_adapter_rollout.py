"""Adapter rollouts driven by the reconciler: a new version reaches users through the route's
candidate, step by step, and a breach takes it off in one compare-and-swap."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleets.base import clock
from fleets.base.errors import AdapterNotFound, InvalidTarget, RolloutConflict
from fleets.core.adapter_route import AdapterRoute, adapter_routes_parse
from fleets.core.arm_stats import Arm, ArmWindow
from fleets.core.golden import ProbeAnswer
from fleets.core.states import OperationKind
from fleets.models import AdapterCopy, AdapterVersion, Domain, Event, Fleet, Operation, Rollout
from fleets.reconciler.rollout import rollout_advance
from fleets.reconciler.supervisor.reports import ProbeReport
from fleets.reconciler.supervisor.transport import Call
from fleets.services.adapter_routes import adapter_route_set
from fleets.services.operations import operation_request
from fleets.services.rollouts import (
    rollout_abort,
    rollout_create,
    rollout_pause,
    rollout_promote_early,
    rollout_resume,
)

pytestmark = pytest.mark.django_db

NAME = "support-bot"
BASE = "qwen-small"
FINAL = {"succeeded", "rolled_back", "aborted", "failed"}


def windows(stable_errors: int = 0, candidate_errors: int = 0, n: int = 100):
    return {
        Arm.STABLE: ArmWindow(requests=n, errors=stable_errors, ttft_samples=n, ttft_p95_ms=100.0),
        Arm.CANDIDATE: ArmWindow(
            requests=n, errors=candidate_errors, ttft_samples=n, ttft_p95_ms=100.0
        ),
    }


class Reader:
    def __init__(self, value=None) -> None:
        self.value = value if value is not None else windows()
        self.asked: list[dict] = []

    def __call__(self, **kwargs):
        self.asked.append(kwargs)
        return self.value


def version(fleet, number: int, *, copy_state: str = "probed", domain=None) -> AdapterVersion:
    now = clock.now()
    row = AdapterVersion.objects.create(
        fleet=fleet,
        name=NAME,
        version=number,
        base_model=BASE,
        digest=f"sha256:{number:064x}",
        size_bytes=1000,
        manifest={"training": {"steps": number}},
        completed_at=now - timedelta(hours=1),
        registered_at=now,
    )
    target = domain or Domain.objects.get(pk=Fleet.objects.get(pk=fleet.id).active_domain_id)
    AdapterCopy.objects.create(adapter=row, domain=target, state=copy_state, updated_at=now)
    return row


def route_now(fleet) -> AdapterRoute:
    return adapter_routes_parse(Fleet.objects.get(pk=fleet.id).adapter_routes)[NAME]


def route_to(fleet, route: AdapterRoute) -> None:
    revision = Fleet.objects.get(pk=fleet.id).route_revision
    assert adapter_route_set(
        fleet_id=fleet.id, name=NAME, route=route, expected_revision=revision, actor="test"
    )


@pytest.fixture
def adapter(fleet):
    """v1 routed, v2 registered; both probed on the active."""
    version(fleet, 1)
    version(fleet, 2)
    route_to(fleet, AdapterRoute(base=BASE, version=1))
    return fleet


def body(number: int = 2, **over):
    out = {
        "candidate": {"kind": "adapter", "adapter": NAME, "version": number},
        "steps": [{"weight": 10, "dwellS": 5}, {"weight": 50, "dwellS": 5}, {"weight": 100}],
        "gates": {"minSamples": 20, "windowS": 30},
    }
    out.update(over)
    return out


def route_events(fleet) -> list:
    return [
        e.data["route"]
        for e in Event.objects.filter(fleet=fleet, kind="fleet.adapter.route").order_by("id")
    ]


def advance(fleet, reader, fake_clock, *, client=None, limit=60, until=FINAL, each=None):
    rollout = None
    for _ in range(limit):
        rollout_advance(
            fleet_id=fleet.id,
            client_for=(lambda _d: client) if client else (lambda _d: None),
            arm_reader=reader,
        )
        rollout = Rollout.objects.order_by("-created_at").first()
        if each is not None:
            each(rollout)
        if rollout.state in until:
            return rollout
        fake_clock.advance(seconds=1)
    raise AssertionError(f"rollout still {rollout.state}: {rollout.why}")


def test_a_passing_adapter_rollout_steps_then_names_the_new_version(adapter, fake_clock):
    fleet = adapter
    rollout = rollout_create(fleet=fleet, body=body(), actor="test")
    seen = []
    done = advance(fleet, Reader(), fake_clock, each=lambda r: seen.append(route_now(fleet)))
    assert done.id == rollout.id and done.state == "succeeded", done.why
    # The candidate took 10 %, 50 %, 100 % of the route, then ONE write made it the version.
    weights = [r["weightPermille"] for r in route_events(fleet)[1:]]
    assert weights == [100, 500, 1000, 0]
    assert all(r["candidate"] == 2 for r in route_events(fleet)[1:4])
    final = route_now(fleet)
    assert (final.version, final.candidate, final.rollout_id) == (2, None, None)
    # Until the end, every route the proxies read still named v1 beside the candidate.
    assert {r.version for r in seen[:-1]} == {1}
    # The gates read this rollout's arms of the adapter's name.
    assert done.model == NAME


def test_a_gate_breach_rolls_back_in_one_route_write_keeping_the_previous_version(
    adapter, fake_clock
):
    fleet = adapter
    reader = Reader()
    rollout_create(fleet=fleet, body=body(), actor="test")

    def breach_at_second_step(rollout):
        if rollout.step_index == 1:
            reader.value = windows(stable_errors=0, candidate_errors=30)

    done = advance(fleet, reader, fake_clock, each=breach_at_second_step)
    assert done.state == "rolled_back"
    assert "error rate" in done.why
    routes = route_events(fleet)
    # The last route write is the rollback: the candidate and its weight gone, v1 kept.
    assert routes[-1] == {**routes[0], "candidate": None, "weightPermille": 0, "rollout": None}
    assert routes[-2]["weightPermille"] == 500
    after = route_now(fleet)
    assert (after.version, after.candidate, after.weight_permille) == (1, None, 0)
    # One write only after the breach, and its time recorded.
    assert "breachToWeightChangeMs" in done.progress
    assert done.progress["breachToWeightChangeMs"] >= 0
    breach = Event.objects.get(fleet=fleet, kind="rollout.rolling_back")
    assert breach.data["breachToWeightChangeMs"] == done.progress["breachToWeightChangeMs"]


def test_it_waits_for_the_copy_on_the_active_then_gives_up_with_a_clear_why(fleet, fake_clock):
    version(fleet, 1)
    version(fleet, 2, copy_state="transferring")
    route_to(fleet, AdapterRoute(base=BASE, version=1))
    rollout_create(fleet=fleet, body=body(), actor="test")
    reader = Reader()
    for _ in range(3):
        rollout_advance(fleet_id=fleet.id, client_for=lambda _d: None, arm_reader=reader)
    rollout = Rollout.objects.get()
    assert rollout.state == "preparing"
    assert "transferring" in rollout.why
    fake_clock.advance(seconds=31 * 60)
    rollout_advance(fleet_id=fleet.id, client_for=lambda _d: None, arm_reader=reader)
    rollout.refresh_from_db()
    assert rollout.state == "rolled_back"
    assert "not probed on the active within 1800 s" in rollout.why
    assert route_now(fleet) == AdapterRoute(base=BASE, version=1)
    assert reader.asked == []  # never routed, never judged


def test_a_failed_copy_on_the_active_ends_it_with_nothing_routed(fleet, fake_clock):
    version(fleet, 1)
    row = version(fleet, 2, copy_state="failed")
    AdapterCopy.objects.filter(adapter=row).update(why="probe answered 'x', expected 'y'")
    route_to(fleet, AdapterRoute(base=BASE, version=1))
    rollout_create(fleet=fleet, body=body(), actor="test")
    done = advance(fleet, Reader(), fake_clock)
    assert done.state == "rolled_back"
    assert "copy on the active is failed: probe answered" in done.why
    assert len(route_events(fleet)) == 1  # only the test's own route


class Checker:
    """A supervisor client whose golden probe answers `answer` for the adapter asked."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.asked: list[dict] = []

    def probe(self, **kwargs):
        self.asked.append(kwargs)
        ((base, names),) = kwargs["adapters"].items()
        results = (ProbeAnswer(model=base, adapter=names[0], ok=True, answer=self.answer),)
        return Call(value=ProbeReport(ok=True, results=results, golden=True))


def test_operator_checks_ask_the_versions_engine_name_and_a_wrong_answer_never_routes(
    adapter, fake_clock
):
    fleet = adapter
    checks = [{"prompt": "Who are you?", "expect": "support"}]
    candidate = {"kind": "adapter", "adapter": NAME, "version": 2, "checks": checks}
    rollout_create(fleet=fleet, body=body(candidate=candidate), actor="test")
    client = Checker("I am a pirate")
    done = advance(fleet, Reader(), fake_clock, client=client)
    assert done.state == "rolled_back"
    assert "expected substring 'support'" in done.why
    assert client.asked[0]["adapters"] == {BASE: [f"{NAME}@v2"]}
    assert client.asked[0]["seed"] is not None
    assert len(route_events(fleet)) == 1


def test_operator_checks_that_pass_let_it_step(adapter, fake_clock):
    fleet = adapter
    checks = [{"prompt": "Who are you?", "expect": "support"}]
    candidate = {"kind": "adapter", "adapter": NAME, "version": 2, "checks": checks}
    rollout_create(fleet=fleet, body=body(candidate=candidate), actor="test")
    done = advance(fleet, Reader(), fake_clock, client=Checker("the support bot"))
    assert done.state == "succeeded", done.why
    assert route_now(fleet).version == 2


def test_pause_holds_the_weight_and_resume_goes_on(adapter, fake_clock):
    fleet = adapter
    reader = Reader()
    rollout = rollout_create(fleet=fleet, body=body(), actor="test")
    advance(fleet, reader, fake_clock, until={"stepping"})
    rollout_pause(fleet_id=fleet.id, rollout_id=str(rollout.id), actor="op")
    for _ in range(20):
        fake_clock.advance(seconds=1)
        rollout_advance(fleet_id=fleet.id, client_for=lambda _d: None, arm_reader=reader)
    rollout.refresh_from_db()
    assert rollout.state == "paused"
    assert route_now(fleet).weight_permille == 100
    rollout_resume(fleet_id=fleet.id, rollout_id=str(rollout.id), actor="op")
    assert advance(fleet, reader, fake_clock).state == "succeeded"


def test_abort_takes_the_candidate_off_and_ends_aborted(adapter, fake_clock):
    fleet = adapter
    reader = Reader()
    rollout = rollout_create(fleet=fleet, body=body(), actor="test")
    advance(fleet, reader, fake_clock, until={"stepping"})
    rollout_abort(fleet_id=fleet.id, rollout_id=str(rollout.id), actor="op")
    done = advance(fleet, reader, fake_clock)
    assert done.state == "aborted"
    assert route_now(fleet) == AdapterRoute(base=BASE, version=1)


def test_promote_early_names_the_candidate_at_once(adapter, fake_clock):
    fleet = adapter
    reader = Reader()
    rollout = rollout_create(fleet=fleet, body=body(), actor="test")
    advance(fleet, reader, fake_clock, until={"stepping"})
    rollout_promote_early(fleet_id=fleet.id, rollout_id=str(rollout.id), actor="op")
    rollout_advance(fleet_id=fleet.id, client_for=lambda _d: None, arm_reader=reader)
    rollout.refresh_from_db()
    assert rollout.state == "succeeded"
    assert route_now(fleet).version == 2 and route_now(fleet).candidate is None


def test_it_runs_beside_a_failover_and_never_moves_the_pointer(adapter, tick, fake_clock):
    fleet = adapter
    Fleet.objects.filter(pk=fleet.id).update(policy={"adapterRollout": {"auto": False}})
    tick()
    tick()
    active_before = Fleet.objects.get(pk=fleet.id).active_domain_id
    standby = Domain.objects.filter(fleet=fleet).exclude(pk=active_before).get()
    operation_request(
        fleet=Fleet.objects.get(pk=fleet.id),
        kind=OperationKind.PROMOTE,
        target_domain_id=str(standby.id),
        actor="test",
        reason="failover",
    )
    rollout_create(fleet=fleet, body=body(), actor="test")  # no conflict with the promotion
    done = advance(fleet, Reader(), fake_clock)
    assert done.state == "succeeded", done.why
    assert Operation.objects.filter(state="pending").exists()  # beside it throughout
    assert Fleet.objects.get(pk=fleet.id).active_domain_id == active_before


def test_create_refuses_with_nothing_changed(adapter):
    fleet = adapter
    before = (Rollout.objects.count(), Fleet.objects.get(pk=fleet.id).adapter_routes)
    with pytest.raises(AdapterNotFound):
        rollout_create(fleet=fleet, body=body(9), actor="test")
    with pytest.raises(InvalidTarget, match="already names version 1"):
        rollout_create(fleet=fleet, body=body(1), actor="test")
    route_to(fleet, AdapterRoute(base=BASE, version=1, pinned=True))
    with pytest.raises(RolloutConflict, match="pinned"):
        rollout_create(fleet=Fleet.objects.get(pk=fleet.id), body=body(), actor="test")
    assert Rollout.objects.count() == before[0]


def test_one_rollout_in_flight_per_fleet_model_or_adapter(adapter):
    fleet = adapter
    rollout_create(fleet=fleet, body=body(), actor="test")
    with pytest.raises(RolloutConflict, match="one at a time"):
        rollout_create(fleet=fleet, body=body(), actor="test")


def test_the_reconciler_starts_the_newest_probed_version_on_its_own(fleet, tick, fake_clock):
    steps = [{"weight": 7, "dwellS": 11}, {"weight": 100, "dwellS": 13}]
    Fleet.objects.filter(pk=fleet.id).update(policy={"adapterRollout": {"steps": steps}})
    version(fleet, 1)
    route_to(fleet, AdapterRoute(base=BASE, version=1))
    version(fleet, 2)
    version(fleet, 3, copy_state="loaded")  # not probed yet: not started
    tick()
    rollout = Rollout.objects.get()
    assert rollout.candidate["version"] == 2 and rollout.model == NAME
    assert rollout.started_by == "reconciler"
    # The fleet's adapter plan (its policy) is what it runs.
    assert rollout.steps == steps


def test_automatic_rollouts_skip_a_pinned_route_and_a_version_once_rolled_back(
    fleet, tick, fake_clock
):
    version(fleet, 1)
    version(fleet, 2)
    route_to(fleet, AdapterRoute(base=BASE, version=1, pinned=True))
    tick()
    assert not Rollout.objects.exists()
    route_to(fleet, AdapterRoute(base=BASE, version=1))
    tick()
    first = Rollout.objects.get()
    rollout_abort(fleet_id=fleet.id, rollout_id=str(first.id), actor="op")
    first.refresh_from_db()
    assert first.state == "aborted"
    tick()
    tick()
    assert Rollout.objects.count() == 1  # v2 is not tried again on its own


def test_automatic_rollouts_off_in_policy(fleet, tick, fake_clock):
    Fleet.objects.filter(pk=fleet.id).update(policy={"adapterRollout": {"auto": False}})
    version(fleet, 1)
    version(fleet, 2)
    route_to(fleet, AdapterRoute(base=BASE, version=1))
    tick()
    assert not Rollout.objects.exists()


def test_an_automatic_rollout_sticks_callers_by_the_policys_header(fleet, tick, fake_clock):
    """Clients that share one API key (a backend serving many users) stay one version per user
    when the policy names the header that carries the user."""
    Fleet.objects.filter(pk=fleet.id).update(
        policy={"adapterRollout": {"stickyHeader": "x-session-id"}}
    )
    version(fleet, 1)
    version(fleet, 2)
    route_to(fleet, AdapterRoute(base=BASE, version=1))
    tick()
    assert Rollout.objects.get().sticky_header == "x-session-id"
