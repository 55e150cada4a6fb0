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


def test_a_fleet_given_back_a_moment_ago_waits_one_interval_from_that_tick():
    assert tick_due_in(TickLeaseRow("", _at(-1)), now=NOW, interval_s=5) == 4


def test_a_fleet_given_back_half_an_interval_ago_or_more_is_due_now():
    assert tick_due_in(TickLeaseRow("", _at(-2.5)), now=NOW, interval_s=5) == 0
    assert tick_due_in(TickLeaseRow("", _at(-60)), now=NOW, interval_s=5) == 0


def test_a_release_stamped_ahead_of_our_clock_waits_at_most_one_interval():
    assert tick_due_in(TickLeaseRow("", _at(30)), now=NOW, interval_s=5) == 5
