"""A tick lease that outlasts the chat hold is refused at start-up (haru.E005, issue 29).

A worker frozen holding a fleet's lease delays that fleet by up to one lease; if the active
fails meanwhile, the requests the proxy holds for it must still be waiting when another worker
takes the fleet over and fails it over (docs/tick-lease.md, "Lease and hold").
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.checks import run_checks

from fleets.base.setting_table import HaruSettings
from fleets.checks import TAKEOVER_BUDGET_MS


@pytest.fixture
def timings(monkeypatch):
    def set_timings(*, lease_ms: int, hold_ms: int) -> list:
        monkeypatch.setitem(settings.HARU, "tick_lease_ms", lease_ms)
        monkeypatch.setitem(settings.HARU, "chat_hold_ms", hold_ms)
        return [m for m in run_checks() if m.id == "haru.E005"]

    return set_timings


def test_the_defaults_leave_a_takeover_room_within_the_hold():
    lease, hold = HaruSettings.tick_lease_ms.default, HaruSettings.chat_hold_ms.default
    assert lease + TAKEOVER_BUDGET_MS <= hold, (lease, hold)


def test_the_defaults_pass_the_check(timings):
    lease, hold = HaruSettings.tick_lease_ms.default, HaruSettings.chat_hold_ms.default
    assert timings(lease_ms=lease, hold_ms=hold) == []


def test_the_old_defaults_are_refused_naming_both_settings_and_both_fixes(timings):
    # 15 s lease, 10 s hold: the frozen worker, whose held requests got 503 at 10 s.
    [error] = timings(lease_ms=15_000, hold_ms=10_000)
    assert error.is_serious()
    assert "HARU_TICK_LEASE_MS (15000)" in error.msg and "HARU_CHAT_HOLD_MS (10000)" in error.msg
    assert "at least 20000" in error.hint and "at most 5000" in error.hint


def test_a_lease_just_short_of_the_hold_without_room_for_the_failover_is_refused(timings):
    assert timings(lease_ms=15_000, hold_ms=15_000 + TAKEOVER_BUDGET_MS - 1)
    assert timings(lease_ms=15_000, hold_ms=15_000 + TAKEOVER_BUDGET_MS) == []


def test_holding_turned_off_needs_no_room(timings):
    assert timings(lease_ms=600_000, hold_ms=0) == []
