"""Rollouts driven by ticks against scripted supervisors, with injected per-arm windows."""

from __future__ import annotations

import pytest

from common.wire.shape import FEATURE_MODEL_SWAP
from fleets.base.errors import OperationConflict
from fleets.core.arm_stats import Arm, ArmWindow
from fleets.core.readiness import ReadinessVerdict
from fleets.models import Event, Fleet, ModelBinding, Operation, Rollout
from fleets.reads.readiness import fleet_readiness
from fleets.services.operations import operation_request
from fleets.services.rollouts import (
    rollout_abort,
    rollout_create,
    rollout_pause,
    rollout_promote_early,
    rollout_resume,
)

pytestmark = pytest.mark.django_db

MODEL = "qwen-small"
PROFILE = {"engine": "sim", "extraArgs": ["--weights-mib", "6144", "--ttft-ms", "40"]}
FINAL = {"succeeded", "rolled_back", "aborted", "failed"}


def windows(stable_ttft: float = 100.0, candidate_ttft: float = 100.0, n: int = 100):
    return {
        Arm.STABLE: ArmWindow(requests=n, ttft_samples=n, ttft_p95_ms=stable_ttft),
        Arm.CANDIDATE: ArmWindow(requests=n, ttft_samples=n, ttft_p95_ms=candidate_ttft),
    }


class Reader:
    """The injected arm reader: answers `value` and keeps every window it was asked for."""

    def __init__(self, value=None) -> None:
        self.value = value if value is not None else windows()
        self.asked: list[dict] = []

    def __call__(self, **kwargs):
        self.asked.append(kwargs)
        return self.value


def body(kind: str = "new-weights", **over):
    checks = [{"prompt": "Say hello", "expect": "Hello"}] if kind == "new-weights" else []
    out = {
        "model": MODEL,
        "candidate": {"kind": kind, "profile": PROFILE, "checks": checks},
        "steps": [{"weight": 10, "dwellS": 5}, {"weight": 50, "dwellS": 5}, {"weight": 100}],
        "gates": {"minSamples": 20, "windowS": 30},
    }
    out.update(over)
    return out


@pytest.fixture
def golden(hosts):
    for host in hosts.hosts.values():
        host.golden = True
    return hosts


def drive(tick, reader, clock, *, limit=80, step_s=1.0, until=FINAL, each=None):
    rollout = None
    for _ in range(limit):
        tick(arm_reader=reader)
        rollout = Rollout.objects.order_by("-created_at").first()
        if each is not None:
            each(rollout)
        if rollout is not None and rollout.state in until:
            return rollout
        clock.advance(seconds=step_s)
    raise AssertionError(f"rollout still {rollout.state if rollout else None}: {rollout.why}")


def split_weights(fleet) -> list:
    return [
        (e.data["split"] or {}).get("weightPermille")
        for e in Event.objects.filter(fleet=fleet, kind="fleet.route.split").order_by("id")
    ]


def test_a_rollout_that_passes_ends_with_both_domains_on_the_new_version(
    fleet, tick, golden, domains, fake_clock
):
    tick()
    tick()
    rollout = rollout_create(fleet=fleet, body=body(), actor="test")
    verdicts = []

    def readiness(_):
        verdicts.append(fleet_readiness(Fleet.objects.get(pk=fleet.id)).verdict)

    done = drive(tick, Reader(), fake_clock, each=readiness)

    assert done.id == rollout.id
    assert done.state == "succeeded", done.why
    fleet.refresh_from_db()
    west, east = domains()["west"], domains()["east"]
    assert fleet.active_domain_id == west.id
    assert fleet.route_splits == {}
    # Both domains run the new profile; the bindings say so and point at the new servers.
    for host in golden.hosts.values():
        assert host.profiles[MODEL] == PROFILE
    for domain in (west, east):
        binding = ModelBinding.objects.get(domain=domain, name=MODEL)
        assert binding.profile == PROFILE
        assert binding.serving_url.endswith(f":{golden.hosts[domain.slug].ports[MODEL]}")
    # The old active ends in standby posture: asleep, training.
    assert all(golden.hosts["east"].models.values())
    assert golden.hosts["east"].trainer == "running"
    # The weight went 10 % then 50 %, then the planned promotion made the candidate serve all.
    assert split_weights(fleet) == [100, 500]
    promotion = Operation.objects.get(pk=done.progress["promotionId"])
    assert promotion.state == "succeeded" and promotion.reason == "rollout"
    # Never not-ready because of the rollout: the candidate standby is awake and serving.
    assert ReadinessVerdict.NOT_READY not in verdicts, verdicts
    kinds = set(Event.objects.filter(fleet=fleet).values_list("kind", flat=True))
    assert {
        "rollout.requested",
        "rollout.checking",
        "rollout.stepped",
        "rollout.succeeded",
    } <= kinds


def test_a_slow_candidate_is_rolled_back_in_one_compare_and_swap(
    fleet, tick, golden, domains, fake_clock
):
    tick()
    tick()
    rollout_create(fleet=fleet, body=body(), actor="test")
    reader = Reader()
    stepping = drive(tick, reader, fake_clock, until={"stepping"})
    assert stepping.weight_permille == 100
    reader.value = windows(stable_ttft=100, candidate_ttft=200)

    done = drive(tick, reader, fake_clock)

    assert done.state == "rolled_back"
    assert "time to first token" in done.why
    assert done.progress["breachToWeightChangeMs"] >= 0
    fleet.refresh_from_db()
    assert fleet.route_splits == {}
    assert fleet.active_domain_id == domains()["east"].id
    assert split_weights(fleet) == [100, None]  # one step, then removed at once
    # The standby is back on its old version, asleep and training.
    west = domains()["west"]
    old = ModelBinding.objects.get(domain=domains()["east"], name=MODEL).profile
    assert ModelBinding.objects.get(domain=west, name=MODEL).profile == old
    assert golden.hosts["west"].profiles[MODEL] == old
    assert all(golden.hosts["west"].models.values())
    assert golden.hosts["west"].trainer == "running"


def test_a_candidate_that_fails_its_answer_check_never_gets_a_request(
    fleet, tick, golden, fake_clock
):
    tick()
    tick()
    golden.hosts["west"].answers[MODEL] = "Goodbye"
    rollout_create(fleet=fleet, body=body(), actor="test")

    done = drive(tick, Reader(), fake_clock)

    assert done.state == "rolled_back"
    assert "answer check failed" in done.why
    assert split_weights(fleet) == []  # the split was never set
    assert golden.hosts["west"].trainer == "running"


def test_a_candidate_gone_wrong_during_a_step_is_caught_before_the_next_weight(
    fleet, tick, golden, fake_clock
):
    tick()
    tick()
    rollout_create(fleet=fleet, body=body(), actor="test")
    reader = Reader()
    stepping = drive(tick, reader, fake_clock, until={"stepping"})
    # Its first step's checks pass; then it starts answering wrongly.
    while (stepping.progress or {}).get("checkedStep") != 0:
        tick(arm_reader=reader)
        stepping = Rollout.objects.get(pk=stepping.pk)
    golden.hosts["west"].answers[MODEL] = "Goodbye"

    done = drive(tick, reader, fake_clock)

    assert done.state == "rolled_back"
    assert "answer check failed" in done.why
    # The checks of step 2 ran at step 1's weight: the 50 % share was never set.
    assert split_weights(fleet) == [100, None]
    assert done.progress["breachToWeightChangeMs"] >= 0


def test_same_weights_compare_the_candidate_with_the_stable_arm(fleet, tick, golden, fake_clock):
    tick()
    tick()
    golden.hosts["west"].answers[MODEL] = "Hello from a changed engine"
    rollout_create(fleet=fleet, body=body(kind="same-weights"), actor="test")

    done = drive(tick, Reader(), fake_clock)

    assert done.state == "rolled_back"
    assert "the stable arm" in done.why


def test_a_swap_that_fails_rolls_back_without_a_split(fleet, tick, golden, fake_clock):
    tick()
    tick()
    golden.hosts["west"].swap_fails = True
    rollout_create(fleet=fleet, body=body(), actor="test")

    done = drive(tick, Reader(), fake_clock)

    assert done.state == "rolled_back"
    assert "swap on west failed" in done.why
    assert split_weights(fleet) == []
    assert golden.hosts["west"].trainer == "running"


def test_if_the_active_fails_mid_rollout_failover_comes_first_and_the_rollout_pauses(
    fleet, tick, golden, domains, fake_clock
):
    tick()
    tick()
    rollout_create(fleet=fleet, body=body(), actor="test")
    stepping = drive(tick, Reader(), fake_clock, until={"stepping"})
    assert stepping.weight_permille == 100
    golden.hosts["east"].down = True

    paused = drive(tick, Reader(), fake_clock, until={"paused"})

    assert paused.progress["pausedBy"] == "failover"
    assert not paused.pinned
    # The failover runs to its end while the rollout waits: west serves everything.
    for _ in range(20):
        tick(arm_reader=Reader())
        fake_clock.advance(seconds=1)
        if not Operation.objects.filter(state__in=["pending", "running"]).exists():
            break
    fleet.refresh_from_db()
    assert fleet.active_domain_id == domains()["west"].id
    assert fleet.route_splits == {}
    assert Rollout.objects.get(pk=paused.id).state == "paused"
    # The operator resumes: the candidate is the active, so the rollout goes on to finishing.
    resumed = rollout_resume(fleet_id=fleet.id, rollout_id=str(paused.id), actor="ops")
    assert resumed.state == "finishing"


def test_if_the_standby_fails_the_rollout_rolls_back(fleet, tick, golden, domains, fake_clock):
    tick()
    tick()
    rollout_create(fleet=fleet, body=body(), actor="test")
    drive(tick, Reader(), fake_clock, until={"stepping"})
    golden.hosts["west"].down = True

    done = drive(tick, Reader(), fake_clock, limit=120)

    assert done.state == "rolled_back"
    assert "west" in done.why
    fleet.refresh_from_db()
    assert fleet.route_splits == {}
    assert fleet.active_domain_id == domains()["east"].id


def test_an_operator_promotion_waits_for_the_rollout_but_a_failover_does_not(
    fleet, tick, golden, domains
):
    tick()
    tick()
    rollout_create(fleet=fleet, body=body(), actor="test")
    west = domains()["west"]
    with pytest.raises(OperationConflict, match="rollout"):
        operation_request(fleet=fleet, kind="promote", target_domain_id=str(west.id))
    with pytest.raises(OperationConflict, match="rollout"):
        operation_request(fleet=fleet, kind="drill", target_domain_id=None)
    result = operation_request(
        fleet=fleet, kind="promote", target_domain_id=str(west.id), reason="auto_failover"
    )
    assert result.created


def test_a_pinned_rollout_is_never_rolled_back_automatically(fleet, tick, golden, fake_clock):
    tick()
    tick()
    rollout_create(fleet=fleet, body=body(), actor="test")
    stepping = drive(tick, Reader(), fake_clock, until={"stepping"})
    rollout_pause(fleet_id=fleet.id, rollout_id=str(stepping.id), actor="ops")
    slow = Reader(windows(stable_ttft=100, candidate_ttft=500))

    for _ in range(10):
        tick(arm_reader=slow)
        fake_clock.advance(seconds=5)

    held = Rollout.objects.get(pk=stepping.id)
    assert (held.state, held.pinned, held.weight_permille) == ("paused", True, 100)
    fleet.refresh_from_db()
    assert fleet.route_splits[MODEL]["weightPermille"] == 100
    # Resumed, the gate reads again: the breach rolls it back.
    rollout_resume(fleet_id=fleet.id, rollout_id=str(held.id), actor="ops")
    done = drive(tick, slow, fake_clock)
    assert done.state == "rolled_back"


def test_an_abort_restores_the_standby_and_ends_aborted(fleet, tick, golden, domains, fake_clock):
    tick()
    tick()
    rollout_create(fleet=fleet, body=body(), actor="test")
    stepping = drive(tick, Reader(), fake_clock, until={"stepping"})
    rollout_abort(fleet_id=fleet.id, rollout_id=str(stepping.id), actor="ops")

    done = drive(tick, Reader(), fake_clock)

    assert done.state == "aborted"
    fleet.refresh_from_db()
    assert fleet.route_splits == {}
    old = ModelBinding.objects.get(domain=domains()["east"], name=MODEL).profile
    assert golden.hosts["west"].profiles[MODEL] == old
    assert all(golden.hosts["west"].models.values())
    assert golden.hosts["west"].trainer == "running"


def test_promote_early_skips_the_remaining_steps(fleet, tick, golden, domains, fake_clock):
    tick()
    tick()
    plan = body(
        steps=[{"weight": 1, "dwellS": 3600}, {"weight": 5, "dwellS": 3600}, {"weight": 100}]
    )
    rollout_create(fleet=fleet, body=plan, actor="test")
    stepping = drive(tick, Reader(), fake_clock, until={"stepping"})
    rollout_promote_early(fleet_id=fleet.id, rollout_id=str(stepping.id), actor="ops")

    done = drive(tick, Reader(), fake_clock)

    assert done.state == "succeeded", done.why
    assert split_weights(fleet) == [10]
    fleet.refresh_from_db()
    assert fleet.active_domain_id == domains()["west"].id


def test_a_standby_that_cannot_swap_is_found_before_anything_changes(
    fleet, tick, golden, fake_clock
):
    west = golden.hosts["west"]
    west.features = tuple(f for f in west.features if f != FEATURE_MODEL_SWAP)
    # Created before any heartbeat: the standby's features are not known yet.
    rollout_create(fleet=fleet, body=body(), actor="test")

    done = drive(tick, Reader(), fake_clock)

    assert done.state == "rolled_back"
    assert "model.swap" in done.why
    assert west.effects["swap_requested"] == 0
    assert split_weights(fleet) == []
    assert west.trainer == "running"


def test_an_in_place_rollout_and_its_rollback_keep_the_port(
    fleet, tick, golden, domains, fake_clock
):
    tick()
    tick()
    west = golden.hosts["west"]
    rollout_create(fleet=fleet, body=body(swapMode="in-place"), actor="test")
    reader = Reader()
    drive(tick, reader, fake_clock, until={"stepping"})
    port = west.ports[MODEL]
    reader.value = windows(stable_ttft=100, candidate_ttft=300)

    done = drive(tick, reader, fake_clock)

    assert done.state == "rolled_back"
    assert west.effects["swapped"] == 2  # there and back, each awaited as its own swap
    assert west.ports[MODEL] == port
    binding = ModelBinding.objects.get(domain=domains()["west"], name=MODEL)
    assert binding.serving_url.endswith(f":{port}")
