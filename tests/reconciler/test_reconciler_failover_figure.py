"""One failover has one figure wherever it is shown (issue 28).

The failover of an active whose supervisor alone died: its model servers kept serving until the
degraded grace ran out, so the outage began when they were last seen serving, not at the
supervisor's last heartbeat. The switch_route event, both /metrics series, the recovery endpoint,
the fleet page's recovery panel and its chart all read the same figure, from that start to the
routing commit; the best-effort sleep of the old active after the switch is shown apart.
"""

from __future__ import annotations

import re

import pytest

from fleets.dashboard.chart import fmt_ms
from fleets.dashboard.selectors import fleet_page, overview_rows
from fleets.models import Event, Operation
from tests.reconciler.test_reconciler_flow import run_until_done

pytestmark = pytest.mark.django_db


def _value(text: str, sample: str) -> float:
    match = re.search(rf"^{re.escape(sample)} ([0-9.e+-]+)$", text, flags=re.M)
    assert match, f"{sample} not in /metrics"
    return float(match.group(1))


def _ms(a, b) -> int:
    return int((b - a).total_seconds() * 1000)


def test_a_supervisor_only_failover_has_one_figure_everywhere(
    fleet, tick, hosts, domains, fake_clock, client
):
    tick()
    hosts.hosts["west"].stop_polls = 2  # west's trainer takes two looks to stop: seconds here
    east = hosts.hosts["east"]
    east.down, east.servers_down = True, set()  # the supervisor's process only
    tick()
    for _ in range(6):  # stale at 3 s, past degradedGraceMs (5 s): held, its servers serve
        fake_clock.advance(ms=1000)
        tick()
    assert not Operation.objects.exists()
    east.servers_down = None  # then the model servers die too: the whole host is gone
    fake_clock.advance(ms=1000)
    tick()
    op = run_until_done(tick, limit=40, clock=fake_clock, step_ms=1000)
    assert op is not None and op.reason == "auto_failover" and op.state == "succeeded"

    # The outage began when east's model servers were last seen serving, seconds after its
    # supervisor's last heartbeat: that heartbeat is not when clients stopped being served.
    assert op.detected_at is not None and op.served_at is not None
    assert op.source_seen_at is not None and _ms(op.source_seen_at, op.detected_at) >= 5000
    figure = _ms(op.detected_at, op.served_at)
    assert 1000 <= figure < 5000

    switched = Event.objects.get(operation=op, kind="operation.step.done", step="switch_route")
    assert switched.data["failoverMs"] == figure

    text = client.get("/metrics").content.decode()
    assert _value(text, "haru_failover_duration_seconds_count") == 1
    assert _value(text, "haru_failover_duration_seconds_sum") == pytest.approx(figure / 1000)
    for q in ("0.5", "0.95"):
        sample = f'haru_recovery_seconds{{fleet="demo",kind="failover",quantile="{q}"}}'
        assert _value(text, sample) == pytest.approx(figure / 1000)

    report = client.get("/v1/fleets/demo/recovery").json()
    (only,) = report["samples"]
    assert only["totalMs"] == figure and report["failover"]["p50Ms"] == figure
    assert only["detectionMs"] == _ms(op.detected_at, op.started_at)

    page = fleet_page(fleet, now=fake_clock.now())
    [row] = [r for r in page["recovery"]["rows"] if r["kind"] == "failover"]
    assert row["p50"] == row["p95"] == fmt_ms(figure)
    [bar] = page["chart"].bars
    assert bar.figure == fmt_ms(figure)
    # The bar is the figure; the old active's sleep, retried against a dead supervisor until
    # its budget ran out, is shown apart and adds nothing to the bar's height.
    slept = Event.objects.get(operation=op, step="demote_old_sleep")
    assert slept.kind == "operation.step.timeout_best_effort" and slept.duration_ms > figure
    assert bar.after == f"+{fmt_ms(slept.duration_ms + _after_train_ms(op))}"
    assert "demote_old_sleep" in bar.after_title and "timeout best effort" in bar.after_title
    assert {r.series for r in bar.rects} <= {"detection", *_PATH}
    drawn = sum(r.h for r in bar.rects)
    top = page["chart"].ticks[-1]
    full = page["chart"].plot_bottom - top.y
    # Scaled to the figure (it fills most of the plot), not to the figure plus the 18 s after
    # the switch (it would be a sliver under a 19 s bar).
    assert 0.5 <= drawn / full <= 1

    [overview] = overview_rows(now=fake_clock.now())
    assert overview["last_failover_at"] is not None


_PATH = ("stop_training", "verify_gpu", "wake", "probe", "switch_route")


def _after_train_ms(op) -> int:
    train = Event.objects.filter(operation=op, step="demote_old_train").first()
    return (train.duration_ms or 0) if train else 0
