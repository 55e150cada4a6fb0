"""One failover, one figure: from the outage's recorded start to the routing commit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleets.core.outage import failover_ms, outage_start, span_ms
from fleets.core.read_model import DomainView, ModelView

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_the_figure_runs_from_the_recorded_start_to_the_routing_commit():
    figure = failover_ms(
        kind="promote",
        source_state="ready",
        detected_at=_at(7.0),
        source_seen_at=_at(0.0),  # the supervisor's last heartbeat: not the outage's start
        served_at=_at(8.1),
    )
    assert figure == 1100


def test_an_operation_recorded_without_its_start_falls_back_to_the_last_heartbeat():
    assert outage_start(detected_at=None, source_seen_at=_at(1)) == _at(1)
    assert outage_start(detected_at=_at(3), source_seen_at=_at(1)) == _at(3)
    assert (
        failover_ms(
            kind="promote",
            source_state="failed",
            detected_at=None,
            source_seen_at=_at(1),
            served_at=_at(4),
        )
        == 3000
    )


def test_no_figure_without_an_outage_or_before_routing_moved():
    planned = {"kind": "promote", "source_state": "ready", "detected_at": None}
    assert failover_ms(**planned, source_seen_at=_at(0), served_at=_at(5)) is None
    drill = {"kind": "drill", "source_state": "failed", "detected_at": _at(0)}
    assert failover_ms(**drill, source_seen_at=_at(0), served_at=_at(5)) is None
    running = {"kind": "promote", "source_state": "failed", "detected_at": _at(0)}
    assert failover_ms(**running, source_seen_at=_at(0), served_at=None) is None
    assert span_ms(_at(5), _at(4)) == 0  # a clock step back never reads negative


def test_a_domains_outage_starts_after_its_last_sign_of_serving():
    # Its supervisor's last heartbeat at 0 s, a model server seen serving at 6 s.
    domain = DomainView(
        id="d",
        slug="east",
        state="failed",
        last_seen_at=_at(0),
        models=(ModelView("m", "http://m", "s", 0, "awake", serving_seen_at=_at(6)),),
    )
    assert domain.outage_started_at() == _at(6)
    assert domain.outage_started_at(_at(-1)) == _at(-1)  # an earlier failed request wins
    assert DomainView(id="n", slug="new", state="failed").outage_started_at() is None
