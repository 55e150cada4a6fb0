"""Every input of the heartbeat mirroring rules, checked against an independent spec.

The spec below is written from the design (docs/design.md, "Heartbeats"), not from the code
under test: for each state and each kind of report it says where the state goes, and every other
combination must leave the state alone. Every move is also checked against the state tables.
"""

from __future__ import annotations

import itertools

import pytest

from fleets.core.mirror import (
    ModelPosture,
    TrainerPosture,
    domain_move,
    inference_move,
    training_move,
)
from fleets.core.states import (
    DomainState,
    InferenceState,
    TrainingState,
    check_transition,
)

P = ModelPosture
# Every posture list of one and two bound models (the rules look at "all", so two is enough to
# mix a good model with a bad one).
POSTURE_LISTS = [(p,) for p in P] + list(itertools.product(P, repeat=2))


def _all(postures, wanted) -> bool:
    return all(p == wanted for p in postures)


def expected_inference(state, postures, *, reachable, is_active, settle_serving):
    """The spec: (to_state or None, in_posture)."""
    awake = reachable and _all(postures, P.AWAKE)
    asleep = reachable and _all(postures, P.ASLEEP)
    if is_active:
        to = {
            ("serving", False): "failed",
            ("failed", True): "serving",
        }.get((state, awake))
        in_posture = awake
    else:
        to = {
            ("sleeping", False): "failed",
            ("failed", True): "sleeping",
        }.get((state, asleep))
        if state == "serving" and settle_serving:
            to = "sleeping" if asleep else "failed"
        in_posture = reachable and all(p in (P.AWAKE, P.ASLEEP) for p in postures)
    return to, in_posture


INFERENCE_CASES = [
    (state, postures, reachable, is_active, settle)
    for state in InferenceState
    for postures in POSTURE_LISTS
    for reachable in (True, False)
    for is_active in (True, False)
    for settle in (True, False)
    # An unreachable supervisor reports nothing: every model reads as missing.
    if reachable or set(postures) == {P.MISSING}
]


@pytest.mark.parametrize(("state", "postures", "reachable", "is_active", "settle"), INFERENCE_CASES)
def test_inference_mirror_follows_the_spec(state, postures, reachable, is_active, settle):
    got = inference_move(
        state, postures, reachable=reachable, is_active=is_active, settle_serving=settle
    )
    want = expected_inference(
        state, postures, reachable=reachable, is_active=is_active, settle_serving=settle
    )
    assert (got.to_state, got.in_posture) == want
    if got.to_state is not None:
        check_transition("inference", state, got.to_state)


@pytest.mark.parametrize("state", ["starting", "waking", "probing", "stopped"])
def test_inference_in_between_and_stopped_states_never_move(state):
    for postures, reachable, is_active, settle in itertools.product(
        POSTURE_LISTS, (True, False), (True, False), (True, False)
    ):
        result = inference_move(
            state, postures, reachable=reachable, is_active=is_active, settle_serving=settle
        )
        assert result.to_state is None


def test_a_serving_standby_settles_only_when_no_operation_is_in_flight():
    asleep = (P.ASLEEP,)
    kw = {"reachable": True, "is_active": False}
    assert inference_move("serving", asleep, settle_serving=False, **kw).to_state is None
    assert inference_move("serving", asleep, settle_serving=True, **kw).to_state == "sleeping"
    assert inference_move("serving", (P.AWAKE,), settle_serving=True, **kw).to_state == "failed"


# (state, trainer) -> to; everything else stays.
TRAINING_SPEC = {
    ("idle", "running"): "training",
    ("training", "idle"): "idle",
    ("training", "absent"): "idle",
}


@pytest.mark.parametrize(
    ("state", "trainer"), list(itertools.product(TrainingState, TrainerPosture))
)
def test_training_mirror_follows_the_spec(state, trainer):
    got = training_move(state, trainer)
    assert got == TRAINING_SPEC.get((state, trainer))
    if got is not None:
        check_transition("training", state, got)


def test_a_trainer_running_without_a_pid_never_counts_as_training():
    assert training_move("idle", TrainerPosture.OTHER) is None


# (state, reachable, is_active, in_posture) -> to; everything else stays.
DOMAIN_SPEC = {
    # unreachable: a ready domain degrades, whatever its role; nothing else moves
    ("ready", False, True, False): "degraded",
    ("ready", False, False, False): "degraded",
    ("ready", False, True, True): "degraded",
    ("ready", False, False, True): "degraded",
    # reachable and in posture: recover one step at a time
    ("provisioning", True, True, True): "ready",
    ("provisioning", True, False, True): "ready",
    ("degraded", True, True, True): "ready",
    ("degraded", True, False, True): "ready",
    ("failed", True, True, True): "degraded",
    ("failed", True, False, True): "degraded",
    # reachable, not in posture: an active that is not fully awake is degraded; a standby whose
    # models are not all known still comes up (it is reachable) and recovers from failed
    ("provisioning", True, True, False): "degraded",
    ("provisioning", True, False, False): "ready",
    ("ready", True, True, False): "degraded",
    ("failed", True, False, False): "degraded",
}


@pytest.mark.parametrize(
    ("state", "reachable", "is_active", "in_posture"),
    list(itertools.product(DomainState, (True, False), (True, False), (True, False))),
)
def test_domain_mirror_follows_the_spec(state, reachable, is_active, in_posture):
    got = domain_move(state, reachable=reachable, is_active=is_active, in_posture=in_posture)
    assert got == DOMAIN_SPEC.get((state, reachable, is_active, in_posture))
    if got is not None:
        check_transition("domain", state, got)


def test_stopping_and_stopped_domains_are_never_mirrored():
    for state, reachable, is_active, in_posture in itertools.product(
        ("stopping", "stopped"), (True, False), (True, False), (True, False)
    ):
        assert (
            domain_move(state, reachable=reachable, is_active=is_active, in_posture=in_posture)
            is None
        )
