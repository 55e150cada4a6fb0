"""Every (from, to) pair of every state table, checked against an independent spec."""

from __future__ import annotations

import itertools

import pytest

from fleets.core import states
from fleets.core.states import InvalidTransition, allowed_sources, check_transition

# Written from the design (docs/design.md, "State tables"), not from the tables under test.
STATES = {
    "domain": "provisioning ready degraded failed stopping stopped",
    "inference": "starting serving sleeping waking probing failed stopped",
    "training": "idle training stopping failed stopped",
    "operation": "pending running succeeded failed cancelled",
}
ALLOWED = {
    "domain": """
        provisioning -> ready degraded failed stopping
        ready -> degraded failed stopping
        degraded -> ready failed stopping
        failed -> provisioning degraded stopping
        stopping -> stopped
        stopped -> provisioning
    """,
    "inference": """
        starting -> serving sleeping failed stopped
        serving -> sleeping failed stopped
        sleeping -> waking failed stopped
        waking -> probing sleeping failed stopped
        probing -> serving sleeping failed stopped
        failed -> serving sleeping waking starting stopped
        stopped -> starting
    """,
    "training": """
        idle -> training failed stopped
        training -> stopping idle failed stopped
        stopping -> idle training failed stopped
        failed -> idle stopped
        stopped -> idle
    """,
    "operation": """
        pending -> running failed cancelled
        running -> succeeded failed cancelled
    """,
}


def _pairs(spec: str) -> set[tuple[str, str]]:
    out = set()
    for line in spec.strip().splitlines():
        src, dsts = line.split("->")
        out |= {(src.strip(), dst) for dst in dsts.split()}
    return out


EXPECTED = {table: _pairs(spec) for table, spec in ALLOWED.items()}
ALL_PAIRS = [
    (table, src, dst)
    for table, names in STATES.items()
    for src, dst in itertools.product(names.split(), repeat=2)
]


def test_every_table_is_covered_by_the_spec():
    assert set(states.TABLES) == set(STATES)


@pytest.mark.parametrize("table", sorted(STATES))
def test_table_knows_exactly_the_specified_states(table):
    assert {str(s) for s in states.TABLES[table]} == set(STATES[table].split())


@pytest.mark.parametrize(("table", "src", "dst"), ALL_PAIRS)
def test_transition_is_allowed_exactly_when_the_spec_says_so(table, src, dst):
    allowed = (src, dst) in EXPECTED[table]
    assert (dst in states.TABLES[table][src]) is allowed
    if allowed:
        check_transition(table, src, dst)
    else:
        with pytest.raises(InvalidTransition) as err:
            check_transition(table, src, dst)
        assert (err.value.table, err.value.from_state, err.value.to_state) == (table, src, dst)


def test_terminal_operation_states_lead_nowhere():
    for state in ("succeeded", "failed", "cancelled"):
        assert not states.OPERATION_TRANSITIONS[state]
    # Every state that is not in flight is one of these three: nothing else ends an operation.
    assert {str(s) for s in states.OperationState} - set(states.IN_FLIGHT_OPERATION_STATES) == {
        "succeeded",
        "failed",
        "cancelled",
    }
    assert {str(s) for s in states.IN_FLIGHT_OPERATION_STATES} == {"pending", "running"}


def test_unknown_state_is_refused_not_crashed():
    with pytest.raises(InvalidTransition):
        check_transition("domain", "exploded", "ready")
    with pytest.raises(InvalidTransition):
        check_transition("domain", "ready", "exploded")


def test_unknown_table_is_a_programming_error():
    with pytest.raises(ValueError, match="unknown state table"):
        check_transition("fleet", "ready", "failed")


def test_invalid_transition_message_names_table_and_pair():
    with pytest.raises(InvalidTransition, match=r"inference: serving -> probing"):
        check_transition("inference", "serving", "probing")


def test_allowed_sources_lists_every_predecessor():
    assert allowed_sources("inference", "serving") == {"starting", "probing", "failed"}
    assert allowed_sources("domain", "stopped") == {"stopping"}
    assert allowed_sources("training", "idle") == {"training", "stopping", "failed", "stopped"}


def test_only_ready_and_degraded_domains_are_promotable():
    assert {str(s) for s in states.PROMOTABLE_DOMAIN_STATES} == {"ready", "degraded"}


def test_promotion_runs_the_designed_steps_in_order():
    assert states.steps_for("promote") == (
        "stop_training",
        "verify_gpu",
        "wake",
        "probe",
        "switch_route",
        "demote_old_sleep",
        "demote_old_train",
    )
    assert states.steps_for("demote") == ("sleep", "start_training")
    assert {"demote_old_sleep", "demote_old_train"} == states.BEST_EFFORT_STEPS


def test_unknown_operation_kind_has_no_steps():
    with pytest.raises(ValueError, match="unknown operation kind"):
        states.steps_for("promotion")


# Initial states, written from the design: static hosts exist already, driver-backed ones are
# provisioned first; training starts idle, inference serving on the active and asleep elsewhere.
INITIAL_DOMAIN = {"static": "ready", "skypilot": "provisioning", "skyserve": "provisioning"}
INITIAL_SLOT = {
    ("training", True): "idle",
    ("training", False): "idle",
    ("inference", True): "serving",
    ("inference", False): "sleeping",
}


@pytest.mark.parametrize("provider", list(states.Provider))
def test_every_provider_has_the_initial_domain_state_of_the_design(provider):
    assert states.initial_domain_state(provider) == INITIAL_DOMAIN[provider]


@pytest.mark.parametrize(
    ("kind", "on_active"), list(itertools.product(states.SlotKind, (True, False)))
)
def test_every_slot_kind_has_the_initial_state_of_the_design(kind, on_active):
    assert states.initial_slot_state(kind, on_active=on_active) == INITIAL_SLOT[kind, on_active]


def test_an_unknown_slot_kind_has_no_initial_state():
    with pytest.raises(ValueError, match="unknown slot kind"):
        states.initial_slot_state("gpu", on_active=True)
