"""`demo restore` demotes a host only once it is back and nothing is in flight.

A crashed host comes back failed until its heartbeat recovers it, and the promotion away from it
may still be putting it to sleep: a demote asked earlier is refused (409 or 422), which the demo
used to print as its outcome.
"""

from __future__ import annotations

import pytest

from haru import demo


def fleet(state: str, operation: object = None) -> dict:
    return {
        "operation": operation,
        "domains": [{"slug": "east", "state": "ready"}, {"slug": "west", "state": state}],
    }


@pytest.mark.parametrize(
    ("snapshot", "ready"),
    [
        (None, False),  # the server is not answering
        (fleet("failed"), False),  # not heartbeated back yet
        (fleet("ready", operation={"id": "x"}), False),  # a promotion still sleeping it
        (fleet("degraded"), True),
        (fleet("ready"), True),
    ],
)
def test_a_host_is_demotable_once_back_and_nothing_is_in_flight(monkeypatch, snapshot, ready):
    monkeypatch.setattr(demo, "current_fleet", lambda: snapshot)
    assert demo._demotable("west") is ready
