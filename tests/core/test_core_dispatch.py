"""When a periodic dispatch ticks a fleet, from its tick lease alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleets.core.dispatch import TickLeaseRow, tick_due_in

NOW = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)
HOLDER = "worker-b:4026532176:812:9c1f2e7a3b4d"


def _at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def test_a_fleet_never_ticked_is_due_now():
    assert tick_due_in(None, now=NOW, interval_s=5) == 0
    assert tick_due_in(TickLeaseRow("", None), now=NOW, interval_s=5) == 0


def test_a_held_lease_defers_the_tick_to_its_deadline():
    assert tick_due_in(TickLeaseRow(HOLDER, _at(12)), now=NOW, interval_s=5) == 12


def test_a_holder_whose_lease_ran_out_is_taken_over_now():
    assert tick_due_in(TickLeaseRow(HOLDER, _at(-0.5)), now=NOW, interval_s=5) == 0


def _ticked(started_s: float, took_s: float = 0.05) -> TickLeaseRow:
    """Given back: a tick that started `started_s` from now and lasted `took_s`."""
    return TickLeaseRow("", _at(started_s + took_s), _at(started_s))


def test_a_fleet_ticked_a_moment_ago_waits_one_interval_from_that_tick():
    assert tick_due_in(_ticked(-1), now=NOW, interval_s=5) == 4


def test_a_fleet_ticked_half_an_interval_ago_or_more_is_due_now():
    assert tick_due_in(_ticked(-2.5), now=NOW, interval_s=5) == 0
    assert tick_due_in(_ticked(-60), now=NOW, interval_s=5) == 0


def test_a_tick_longer_than_half_an_interval_does_not_cost_the_next_beat():
    # A loaded machine: the last beat's tick took 0.4 s of a 0.5 s interval and was given back
    # 0.1 s ago. Counted from its release it would look recent and skip this beat.
    assert tick_due_in(_ticked(-0.5, took_s=0.4), now=NOW, interval_s=0.5) == 0


def test_a_tick_stamped_ahead_of_our_clock_waits_at_most_one_interval():
    assert tick_due_in(_ticked(30), now=NOW, interval_s=5) == 5


def test_a_given_back_row_without_a_start_is_due_now():
    assert tick_due_in(TickLeaseRow("", _at(-1), None), now=NOW, interval_s=5) == 0
