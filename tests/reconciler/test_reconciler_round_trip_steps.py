"""A round-trip drill's second leg: the promotion's executors with target and source swapped."""

from __future__ import annotations

import uuid

from fleets.core.states import DRILL_STEPS, ROUND_TRIP_DRILL_STEPS
from fleets.models import Domain, Operation
from fleets.reconciler.advance import _acted_on
from fleets.reconciler.steps import drill


def _op() -> Operation:
    east = Domain(id=uuid.uuid4(), slug="east")
    west = Domain(id=uuid.uuid4(), slug="west")
    return Operation(
        kind="drill",
        drill_mode="round_trip",
        target_domain=west,
        target_domain_slug="west",
        source_domain=east,
    )


def test_every_drill_step_of_either_mode_has_an_executor():
    assert set(DRILL_STEPS) | set(ROUND_TRIP_DRILL_STEPS) == set(drill.EXECUTORS)


def test_the_second_leg_promotes_the_original_active_and_demotes_the_standby():
    op = _op()
    back = drill.back_leg(op)
    assert (back.target_domain.slug, back.source_domain.slug) == ("east", "west")
    assert back.target_domain_id == op.source_domain_id
    assert back.source_domain_id == op.target_domain_id
    assert back.target_slug == "east"
    # The operation itself is untouched: every other step still sees it as it is.
    assert (op.target_domain.slug, op.source_domain.slug, op.target_slug) == (
        "west",
        "east",
        "west",
    )


def test_each_step_is_recorded_against_the_domain_it_acts_on():
    op = _op()
    west, east = op.target_domain_id, op.source_domain_id
    assert [_acted_on(op, s) for s in ROUND_TRIP_DRILL_STEPS] == [
        west,  # stop_training ... switch_route: the standby taking over
        west,
        west,
        west,
        west,
        east,  # demote_old_sleep, demote_old_train: the original active
        east,
        east,  # back_stop_training ... back_switch_route: the original taking back
        east,
        east,
        east,
        east,
        west,  # back_demote_old_sleep, back_demote_old_train: the standby again
        west,
    ]
