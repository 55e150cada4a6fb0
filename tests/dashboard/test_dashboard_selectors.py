"""Page data: supervisor reports read defensively, drift never guessed, step progress, chart."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from fleets.base import clock
from fleets.core.memory_bars import gpu_bars, report_error
from fleets.core.report import read_report
from fleets.dashboard import chart, selectors
from fleets.dashboard.drift import drift_status, expected_fingerprint
from fleets.dashboard.selectors import fleet_page, overview_rows
from fleets.models import Domain, Event, ModelBinding, Operation, Slot
from fleets.services.events import event_record
from fleets.services.heartbeats import domain_heartbeat_failed
from fleets.services.operations import (
    operation_fail,
    operation_request,
    operation_start,
    operation_step_done,
)
from fleets.services.route_pointer import route_switch
from fleets.services.transitions import domain_transition
from supervisor.engines.fingerprint import profile_fingerprint
from supervisor.engines.profile import parse_profile
from supervisor.engines.registry import default_registry

REPORT = {
    "slots": [
        {
            "gpuIndex": 0,
            "kind": "inference",
            "models": [
                {
                    "name": "qwen-small",
                    "sleeping": False,
                    "fingerprint": "sha256:aa",
                    "process": {"pid": 11},
                },
                {"name": "llama-small", "sleeping": True, "process": {"pid": 12}},
            ],
            "training": None,
        },
        {
            "gpuIndex": 0,
            "kind": "training",
            "models": [],
            "training": {
                "state": "running",
                "pids": [13],
                "lastCheckpointAt": "2026-01-01T00:00:00Z",
            },
        },
    ],
    "gpus": [
        {
            "index": 0,
            "usedMiB": 60000,
            "totalMiB": 80000,
            "name": "H100",
            "processes": [
                {"pid": 11, "usedMiB": 20000},
                {"pid": 12, "usedMiB": 2000},
                {"pid": 13, "usedMiB": 30000},
            ],
        }
    ],
}


# ----------------------------------------------------------------------------------------------
# Reports
# ----------------------------------------------------------------------------------------------


def test_gpu_bar_attributes_memory_to_awake_models_residue_and_training():
    [bar] = gpu_bars(read_report(REPORT), [0])
    assert (bar.used_mib, bar.total_mib, bar.used_pct) == (60000, 80000, 75.0)
    assert [(s.kind, s.mib) for s in bar.segments] == [
        ("awake", 20000),
        ("sleeping", 2000),
        ("training", 30000),
        ("other", 8000),  # used but held by no listed process
    ]
    assert sum(s.pct for s in bar.segments) == pytest.approx(75.0)


def test_gpu_bar_is_unknown_when_the_report_has_no_memory():
    bars = gpu_bars(read_report({"slots": REPORT["slots"]}), [0, 1])
    assert [(b.index, b.used_mib, b.segments) for b in bars] == [(0, None, []), (1, None, [])]
    assert all(b.error for b in bars)


def test_gpu_memory_nested_or_per_mig_instance_is_read():
    nested = {"memory": {"gpus": [{"index": 2, "usedMiB": 10, "totalMiB": 100}]}}
    assert gpu_bars(read_report(nested))[0].used_pct == 10.0
    mig = {
        "gpus": [
            {
                "index": 0,
                "usedMiB": None,
                "totalMiB": None,
                "mig": {
                    "enabled": True,
                    "instances": [
                        {"usedMiB": 5, "totalMiB": 40, "processes": [{"pid": 13, "usedMiB": 5}]},
                        {"usedMiB": 15, "totalMiB": 40, "processes": []},
                    ],
                },
            }
        ],
        "slots": REPORT["slots"],
    }
    [bar] = gpu_bars(read_report(mig))
    assert (bar.used_mib, bar.total_mib, bar.mig) == (20, 80, True)
    assert [(s.kind, s.mib) for s in bar.segments] == [("training", 5), ("other", 15)]


@pytest.mark.parametrize(
    "garbage",
    [
        None,
        [],
        "x",
        {"slots": "x", "gpus": {"a": 1}, "heartbeat": "down"},
        {"slots": [None, 3, {"models": [1]}, {"gpuIndex": "0", "models": [{"name": "m"}]}]},
        {"gpus": [{"index": "0"}, {"index": 0, "usedMiB": True, "totalMiB": 0}]},
        {"heartbeat": {"ok": "no"}, "gpusAt": "yesterday", "gpusError": 7},
    ],
)
def test_malformed_reports_read_as_unknown_not_as_errors(garbage):
    report = read_report(garbage)
    # Nothing malformed becomes a fact: no model, no trainer, no heartbeat note, no GPU time.
    assert report.models() == {} and report.trainings() == {}
    assert report.heartbeat is None and report_error(report) is None
    assert report.gpus_at is None and report.gpus_error is None
    # Each layout GPU reads as unknown memory, with why, never as a figure.
    [bar] = gpu_bars(report, [0])
    assert (bar.index, bar.used_mib, bar.total_mib, bar.used_pct, bar.segments) == (
        0,
        None,
        None,
        None,
        [],
    )
    assert bar.error in ("memory not reported", "no GPU memory in the last report")


def test_each_malformed_field_reads_as_unknown_beside_the_good_ones():
    report = read_report(
        {
            "slots": [
                {
                    "gpuIndex": 0,
                    "kind": "inference",
                    "models": [
                        {"name": "a", "sleeping": "maybe", "fingerprint": 3, "pid": "11"},
                        {"name": "b", "sleeping": True, "process": {"pid": 12}},
                    ],
                },
                {"gpuIndex": 1, "kind": "training", "training": {"state": 5, "pids": [1, "2"]}},
            ],
            "gpus": [{"index": 0, "usedMiB": "lots", "totalMiB": 100}],
        }
    )
    a, b = report.models()["a"], report.models()["b"]
    assert (a.sleeping, a.fingerprint, a.pid) == (None, None, None)
    assert (b.sleeping, b.pid) == (True, 12)
    trainer = report.trainings()[1]
    assert (trainer.state, trainer.pids, trainer.checkpoint_at) == (None, (1,), None)
    [bar] = gpu_bars(report)
    assert (bar.used_mib, bar.total_mib, bar.error) == (None, 100, "memory not reported")


def test_models_and_training_are_read_from_the_status_slots():
    models = read_report(REPORT).models()
    assert (models["qwen-small"].sleeping, models["qwen-small"].pid) == (False, 11)
    assert models["llama-small"].fingerprint is None
    training = read_report(REPORT).trainings()[0]
    assert (training.state, training.pids) == ("running", (13,))
    assert training.checkpoint_at.isoformat() == "2026-01-01T00:00:00+00:00"


def test_failed_heartbeat_is_reported_with_its_message():
    report = {
        "heartbeat": {
            "ok": False,
            "error": {"kind": "network", "message": "connection refused"},
            "failingSince": "2026-01-01T00:00:00Z",
        }
    }
    assert (
        report_error(read_report(report))
        == "connection refused (failing since 2026-01-01T00:00:00Z)"
    )
    assert report_error(read_report({"heartbeat": {"ok": True}})) is None


# ----------------------------------------------------------------------------------------------
# Drift
# ----------------------------------------------------------------------------------------------


def test_drift_is_unknown_unless_both_fingerprints_are_known():
    assert drift_status(None, "sha256:a") == "unknown"
    assert drift_status("sha256:a", None) == "unknown"
    assert drift_status("sha256:a", "sha256:a") == "match"
    assert drift_status("sha256:a", "sha256:b") == "drift"


def test_expected_fingerprint_is_the_supervisors_for_the_same_profile():
    profile = {"engine": "sim", "extraArgs": ["--wake-latency-ms", "400"]}
    errors: list[str] = []
    parsed = parse_profile(
        profile,
        "p",
        errors,
        model_name="qwen-small",
        default_gpu_index=0,
        engine_names=default_registry().names(),
    )
    assert not errors
    assert expected_fingerprint(profile, model_name="qwen-small", gpu_index=0) == (
        profile_fingerprint(parsed)
    )
    assert expected_fingerprint({}, model_name="qwen-small", gpu_index=0) is None
    assert expected_fingerprint({"engine": "nope"}, model_name="q", gpu_index=0) is None
    assert expected_fingerprint(["not", "a", "dict"], model_name="q", gpu_index=0) is None


# ----------------------------------------------------------------------------------------------
# The fleet page
# ----------------------------------------------------------------------------------------------


def _card(page, slug):
    return next(d for d in page["domains"] if d["slug"] == slug)


@pytest.mark.django_db
def test_fleet_page_flags_a_running_server_whose_profile_drifted(seeded_fleet, fake_clock):
    east = Domain.objects.get(fleet=seeded_fleet, slug="east")
    profile = {"engine": "sim"}
    ModelBinding.objects.filter(domain=east).update(profile=profile)
    good = expected_fingerprint(profile, model_name="llama-small", gpu_index=0)
    report = {
        "slots": [
            {
                "gpuIndex": 0,
                "kind": "inference",
                "models": [
                    {"name": "llama-small", "sleeping": False, "fingerprint": good},
                    {"name": "qwen-small", "sleeping": False, "fingerprint": "sha256:old"},
                ],
            }
        ]
    }
    Domain.objects.filter(pk=east.pk).update(last_report=report, last_seen_at=fake_clock.now())

    card = _card(fleet_page(seeded_fleet, now=fake_clock.now()), "east")

    models = {m["name"]: m for m in card["inference"][0]["models"]}
    assert models["llama-small"]["drift"] == "match"
    assert models["qwen-small"]["drift"] == "drift"
    assert (card["role"], card["heartbeat_age"], card["stale"]) == ("active", "0.0s", False)
    west = _card(fleet_page(seeded_fleet, now=fake_clock.now()), "west")
    assert {m["drift"] for m in west["inference"][0]["models"]} == {"unknown"}
    assert west["can_promote"] and west["can_demote"]


@pytest.mark.django_db
def test_fleet_page_draws_memory_bars_from_the_heartbeats_gpu_memory(seeded_fleet, fake_clock):
    # What the reconciler stores: the status body, the GPU memory body's `gpus`, their stamps.
    stored = {
        **REPORT,
        "gpusAt": "2026-01-01T00:00:00Z",
        "heartbeat": {"ok": True, "checkedAt": "2026-01-01T00:00:00Z"},
    }
    Domain.objects.filter(fleet=seeded_fleet, slug="west").update(
        last_report=stored, last_seen_at=fake_clock.now()
    )

    card = _card(fleet_page(seeded_fleet, now=fake_clock.now()), "west")

    [bar] = card["gpus"]
    assert (bar.index, bar.name, bar.used_mib, bar.total_mib) == (0, "H100", 60000, 80000)
    assert [(s.kind, s.mib, s.pct) for s in bar.segments] == [
        ("awake", 20000, 25.0),
        ("sleeping", 2000, 2.5),
        ("training", 30000, 37.5),
        ("other", 8000, 10.0),
    ]
    assert card["training"][0]["checkpoint_at"] == "2026-01-01T00:00:00Z"


@pytest.mark.django_db
def test_stale_heartbeat_is_flagged_and_the_fleet_is_unhealthy(seeded_fleet, fake_clock):
    Domain.objects.filter(fleet=seeded_fleet).update(last_seen_at=fake_clock.now())
    fake_clock.advance(seconds=10)  # the example's heartbeatStaleMs is 3000
    page = fleet_page(seeded_fleet, now=fake_clock.now())
    assert _card(page, "east")["stale"]
    assert page["health"] == "bad"
    assert "active east: heartbeat stale" in page["health_reasons"]


@pytest.mark.django_db
def test_operation_progress_shows_done_running_and_pending_steps(seeded_fleet, fake_clock):
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    op = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id).operation
    operation_start(operation_id=op.id)
    fake_clock.advance(ms=1500)
    operation_step_done(operation_id=op.id, step="stop_training")
    fake_clock.advance(ms=40)
    operation_step_done(operation_id=op.id, step="verify_gpu")
    fake_clock.advance(ms=300)

    page = fleet_page(seeded_fleet, now=fake_clock.now())

    progress = page["operation"]
    assert page["operation_in_flight"] and progress["current_step"] == "wake"
    steps = {s["name"]: s for s in progress["steps"]}
    assert (steps["stop_training"]["status"], steps["stop_training"]["elapsed"]) == (
        "done",
        "1.5 s",
    )
    assert (steps["verify_gpu"]["status"], steps["verify_gpu"]["ms"]) == ("done", 40)
    assert (steps["wake"]["status"], steps["wake"]["ms"]) == ("running", 300)
    assert {steps[n]["status"] for n in ("probe", "switch_route", "demote_old_train")} == {
        "pending"
    }


@pytest.mark.django_db
def test_failed_operation_shows_the_error_on_its_step(seeded_fleet, fake_clock):
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    op = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id).operation
    operation_start(operation_id=op.id)
    operation_step_done(operation_id=op.id, step="stop_training")
    operation_step_done(operation_id=op.id, step="verify_gpu")
    operation_step_done(operation_id=op.id, step="wake")
    operation_fail(
        operation_id=op.id, step="probe", code="probe_failed", message="qwen-small: empty reply"
    )

    progress = fleet_page(seeded_fleet, now=fake_clock.now())["operation"]

    assert progress["state"] == "failed" and not progress["in_flight"]
    steps = {s["name"]: s for s in progress["steps"]}
    assert steps["probe"]["status"] == "failed"
    assert steps["probe"]["detail"] == "probe_failed: qwen-small: empty reply"
    assert steps["switch_route"]["status"] == "skipped"
    assert progress["error"]["code"] == "probe_failed"


@pytest.mark.django_db
def test_event_timeline_is_newest_first_with_readable_summaries(seeded_fleet, fake_clock):
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    domain_transition(domain_id=west.id, to_state="degraded", reason="probe slow")
    events = fleet_page(seeded_fleet, now=fake_clock.now())["events"]
    assert events[0]["kind"] == "domain.degraded"
    assert events[0]["domain"] == "west"
    assert events[0]["summary"] == "ready → degraded · probe slow"
    assert events[0]["level"] == "warn"
    assert events[-1]["kind"] == "layout.applied"


@pytest.mark.django_db
def test_failover_chart_stacks_step_durations_of_succeeded_promotions(seeded_fleet, fake_clock):
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    east = Domain.objects.get(fleet=seeded_fleet, slug="east")
    now = fake_clock.now()
    op = Operation.objects.create(
        fleet=seeded_fleet,
        kind="promote",
        state="succeeded",
        target_domain=west,
        source_domain=east,
        reason="auto_failover",
        created_at=now,
        detected_at=now,
        started_at=now + timedelta(milliseconds=800),
        finished_at=now + timedelta(seconds=5),
        routing_committed=True,
    )
    for step, ms in (("stop_training", 1000), ("wake", 2000), ("switch_route", 10)):
        Event.objects.create(
            fleet=seeded_fleet,
            operation=op,
            kind="operation.step.done",
            step=step,
            duration_ms=ms,
            created_at=now,
        )

    result = fleet_page(seeded_fleet, now=now)["chart"]

    assert not result.empty
    [bar] = result.bars
    assert [r.series for r in bar.rects] == ["detection", "stop_training", "wake", "switch_route"]
    heights = {r.series: r.h for r in bar.rects}
    assert heights["wake"] == pytest.approx(2 * heights["stop_training"], rel=0.01)
    assert bar.routing_y == pytest.approx(min(r.y for r in bar.rects))
    assert "to routing 3.8 s" in bar.title


def test_chart_is_empty_without_samples_and_durations_read_well():
    assert chart.build_chart([]).empty
    assert [chart.fmt_ms(v) for v in (None, 12, 1234, 125_000)] == [
        "—",
        "12 ms",
        "1.2 s",
        "2 m 05 s",
    ]


@pytest.mark.django_db
def test_overview_row_shows_active_revision_and_the_in_flight_operation(seeded_fleet, fake_clock):
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    op = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id).operation
    operation_start(operation_id=op.id)
    [row] = overview_rows(now=clock.now())
    assert (row["slug"], row["active_slug"], row["route_revision"]) == ("demo", "east", 1)
    assert row["operation"]["current_step"] == "stop_training"
    assert [d["role"] for d in row["domains"]] == ["active", "standby"]


@pytest.mark.django_db
def test_failing_heartbeat_of_the_active_makes_the_fleet_unhealthy(seeded_fleet, fake_clock):
    Domain.objects.filter(fleet=seeded_fleet, slug="east").update(
        last_report={"heartbeat": {"ok": False, "error": {"message": "connection refused"}}}
    )
    [row] = overview_rows(now=fake_clock.now())
    assert row["health"] == "bad"
    assert row["health_reasons"][0] == "active east: heartbeat failing (connection refused)"


@pytest.mark.django_db
def test_a_slot_woken_after_the_last_heartbeat_shows_its_models_awake(seeded_fleet, fake_clock):

    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    asleep = {
        "slots": [
            {
                "gpuIndex": 0,
                "kind": "inference",
                "models": [
                    {"name": "qwen-small", "sleeping": True},
                    {"name": "llama-small", "sleeping": True},
                ],
            }
        ]
    }
    Domain.objects.filter(pk=west.pk).update(last_report=asleep, last_seen_at=fake_clock.now())
    fake_clock.advance(ms=500)
    # The promotion proved the wake and passed the probe after that heartbeat.
    Slot.objects.filter(domain=west, kind="inference").update(
        state="serving", state_updated_at=fake_clock.now()
    )

    card = _card(fleet_page(seeded_fleet, now=fake_clock.now()), "west")

    assert {m["posture"] for m in card["inference"][0]["models"]} == {"awake"}
    # Once a heartbeat newer than the slot's change arrives, it speaks again.
    fake_clock.advance(ms=500)
    Domain.objects.filter(pk=west.pk).update(last_seen_at=fake_clock.now())
    card = _card(fleet_page(seeded_fleet, now=fake_clock.now()), "west")
    assert {m["posture"] for m in card["inference"][0]["models"]} == {"asleep"}


@pytest.mark.django_db
def test_a_dead_active_does_not_read_serving_traffic(seeded_fleet, fake_clock):

    Domain.objects.filter(fleet=seeded_fleet).update(last_seen_at=fake_clock.now())
    healthy = _card(fleet_page(seeded_fleet, now=fake_clock.now()), "east")
    assert (healthy["serving"], healthy["serving_note"]) == (True, "")

    Domain.objects.filter(fleet=seeded_fleet, slug="east").update(state="failed")
    Slot.objects.filter(domain__slug="east", kind="inference").update(state="failed")
    dead = _card(fleet_page(seeded_fleet, now=fake_clock.now()), "east")
    assert dead["serving"] is False
    assert dead["serving_note"] == "domain failed"

    Domain.objects.filter(fleet=seeded_fleet, slug="east").update(state="ready")
    fake_clock.advance(seconds=10)  # past the example's heartbeatStaleMs
    assert _card(fleet_page(seeded_fleet, now=fake_clock.now()), "east")["serving_note"] == (
        "heartbeat stale"
    )


def _promote_to_the_switch(fleet, target: str = "west") -> Operation:
    """A promotion of `target` whose routing just committed (its best-effort steps to come)."""
    west = Domain.objects.get(fleet=fleet, slug=target)
    op = operation_request(fleet=fleet, kind="promote", target_domain_id=west.id).operation
    operation_start(operation_id=op.id)
    for step in ("stop_training", "verify_gpu", "wake", "probe"):
        operation_step_done(operation_id=op.id, step=step)
    fleet.refresh_from_db()
    assert route_switch(
        fleet_id=fleet.id,
        operation_id=op.id,
        target_domain_id=west.id,
        expected_active_id=fleet.active_domain_id,
        expected_revision=fleet.route_revision,
    )
    operation_step_done(operation_id=op.id, step="switch_route")
    op.refresh_from_db()
    return op


@pytest.mark.django_db
def test_last_failover_is_when_clients_were_served_again_not_when_the_promotion_finished(
    seeded_fleet, fake_clock
):
    east = Domain.objects.get(fleet=seeded_fleet, slug="east")
    # A promotion's routing committed 4 s ago; it is still on its best-effort steps.
    op = _promote_to_the_switch(seeded_fleet)
    assert op.state == "running" and op.served_at == fake_clock.now()
    fake_clock.advance(seconds=3)
    # A round-trip drill's switch is a rehearsal, not a failover (it used to count).
    event_record(fleet_id=seeded_fleet.id, domain_id=east.id, kind="fleet.route.switched")
    fake_clock.advance(seconds=1)

    [row] = overview_rows(now=fake_clock.now())

    assert row["last_failover_at"] == clock.iso(op.served_at)
    assert row["last_failover_age"] == "4.0s"


@pytest.mark.django_db
def test_a_promotion_past_its_switch_says_clients_are_served_and_keeps_skip_remaining(
    seeded_fleet, fake_clock
):
    op = _promote_to_the_switch(seeded_fleet)
    fake_clock.advance(seconds=17)  # the old active's sleep retries against a dead host

    page = fleet_page(seeded_fleet, now=fake_clock.now())
    shown = page["operation"]

    assert shown["in_flight"] and shown["state"] == "running"
    assert shown["cancel_skips_rest"]  # the button stays: the operation is still running
    assert shown["served_at"] == clock.iso(op.served_at)
    assert shown["failover"] == ""  # a planned promotion: no client went unserved


@pytest.mark.django_db
def test_a_retrying_step_shows_its_latest_attempt_and_stays_running(seeded_fleet, fake_clock):

    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    op = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id).operation
    operation_start(operation_id=op.id)
    operation_step_done(operation_id=op.id, step="stop_training")
    operation_step_done(operation_id=op.id, step="verify_gpu")
    for attempt in (1, 2):
        event_record(
            fleet_id=seeded_fleet.id,
            operation_id=op.id,
            kind="operation.step.retry",
            step="wake",
            data={"attempt": attempt, "message": "wake: 502 wake failed"},
        )

    page = fleet_page(seeded_fleet, now=fake_clock.now())

    wake = next(s for s in page["operation"]["steps"] if s["name"] == "wake")
    assert wake["status"] == "running"
    assert wake["detail"] == "retry 2: wake: 502 wake failed"
    # Both attempts are on the timeline, folded into one line that counts them.
    [retries] = [e for e in page["events"] if e["kind"] == "operation.step.retry"]
    assert retries["count"] == 2
    assert retries["summary"] == "attempts 1–2 · wake: 502 wake failed"


@pytest.mark.parametrize(
    "peak_ms", [40, 900, 4_200, 19_000, 59_000, 61_000, 70_000, 130_000, 3_500_000, 5_000_000]
)
def test_chart_axis_labels_fit_the_axis_and_read_whole_at_every_range(peak_ms):
    """Above 60 s the labels ("1 m 00 s") were wider than the room left of the axis, and the
    browser clipped them to ". m 00 s"."""
    when = datetime(2026, 1, 1, tzinfo=UTC)
    sample = chart.FailoverSample("op", when, "manual", "west", {"wake": peak_ms})
    result = chart.build_chart([sample])
    labels = [t.label for t in result.ticks]
    assert labels[0] == "0"
    assert result.ticks[-1].y < result.ticks[0].y
    for label in labels:
        assert len(label) * chart.AXIS_CHAR_W <= result.tick_label_x, label
    # Every tick reads as its own value: a round number of one unit, or minutes with seconds.
    assert len(set(labels)) == len(labels)
    for label in labels[1:]:
        assert re.fullmatch(r"\d+ ms|\d+(\.\d)? s|\d+m(\d\ds)?|\d+h(\d\dm)?|\d+d(\d+h)?", label)


def test_chart_axis_labels_over_a_minute_and_an_hour():
    assert [chart.axis_label(v) for v in (0, 250, 2_500, 45_000, 60_000, 90_000)] == [
        "0",
        "250 ms",
        "2.5 s",
        "45 s",
        "1m",
        "1m30s",
    ]
    assert [chart.axis_label(v) for v in (3_600_000, 5_400_000, 86_400_000 * 3)] == [
        "1h",
        "1h30m",
        "3d",
    ]


@pytest.mark.django_db
def test_repeated_retries_fold_into_one_line_and_keep_the_crash_on_the_timeline(
    seeded_fleet, fake_clock
):
    """A failing wake wrote a retry event every 0.6 s, one timeline line each: the crash's own
    events left the page within a minute. Retries of one step failing the same way are one
    line with their exact count; the rows themselves stay one per attempt."""
    east = Domain.objects.get(fleet=seeded_fleet, slug="east")
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    event_record(fleet_id=seeded_fleet.id, domain_id=east.id, kind="domain.heartbeat.failed")
    event_record(fleet_id=seeded_fleet.id, domain_id=east.id, kind="domain.failed")
    op = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id).operation
    operation_start(operation_id=op.id)
    blob = '{\n  "error": {\n    "code": "wake_failed"\n  }\n}'

    def retry(attempt: int, message: str) -> None:
        fake_clock.advance(ms=600)
        event_record(
            fleet_id=seeded_fleet.id,
            operation_id=op.id,
            domain_id=west.id,
            kind="operation.step.retry",
            step="wake",
            data={"attempt": attempt, "message": f"wake: {message}"},
        )

    for attempt in range(1, 151):
        retry(attempt, blob)
    retry(151, "connection refused")  # another error: a line of its own
    for attempt in range(152, 162):
        retry(attempt, blob)

    events = fleet_page(seeded_fleet, now=fake_clock.now())["events"]

    retries = [e for e in events if e["kind"] == "operation.step.retry"]
    assert [e["count"] for e in retries] == [10, 1, 150]
    assert (
        retries[0]["summary"] == 'attempts 152–161 · wake: { "error": { "code": "wake_failed" } }'
    )
    assert retries[2]["summary"].startswith("attempts 1–150 · ")
    assert (
        sum(e["count"] for e in retries)
        == Event.objects.filter(kind="operation.step.retry").count()
    )
    kinds = [e["kind"] for e in events]
    assert {"domain.heartbeat.failed", "domain.failed"} <= set(kinds)
    assert kinds[-1] == "layout.applied"  # nothing older was pushed out


@pytest.mark.django_db
def test_the_timeline_reads_past_more_retries_than_a_page_holds(
    seeded_fleet, fake_clock, monkeypatch
):
    monkeypatch.setattr(selectors, "RETRY_SCAN_LIMIT", 5)
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    event_record(fleet_id=seeded_fleet.id, domain_id=west.id, kind="domain.failed")
    for attempt in range(1, 9):
        event_record(
            fleet_id=seeded_fleet.id,
            kind="operation.step.retry",
            step="wake",
            data={"attempt": attempt, "message": "wake: refused"},
        )

    events = fleet_page(seeded_fleet, now=fake_clock.now())["events"]

    # The newest five retries, and nothing older than them: no line stands next to a gap.
    assert [(e["kind"], e["count"]) for e in events] == [("operation.step.retry", 5)]


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["heartbeat_failed", "stale", "domain_failed"])
def test_a_host_that_stopped_answering_shows_its_last_report_as_history(
    seeded_fleet, fake_clock, client, django_user_model, how
):
    """A crashed host's card stayed green: "awake models 20000 MiB", its bar, its models
    "awake · profile ok". Once the host does not answer, every part drawn from its last report
    reads as the past: greyed, labelled with the report's time and age."""
    east = Domain.objects.get(fleet=seeded_fleet, slug="east")
    seen = fake_clock.now()
    Domain.objects.filter(pk=east.pk).update(last_report=REPORT, last_seen_at=seen)
    staff = django_user_model.objects.create_user(
        "op", password="pw", is_staff=True, is_superuser=True
    )
    client.force_login(staff)

    def east_card(html: str) -> str:
        start = html.index('data-domain-slug="east"')
        return html[start : html.index("</article>", start)]

    fresh = east_card(client.get("/fleets/demo/live/").content.decode())
    assert 'data-report="current"' in fresh and "last report" not in fresh
    assert ">awake</span>" in fresh

    fake_clock.advance(ms=1200)
    if how == "heartbeat_failed":
        domain_heartbeat_failed(
            domain_id=east.id,
            fleet_id=seeded_fleet.id,
            checked_at=fake_clock.now(),
            error={"code": "unreachable", "message": "connection refused"},
        )
    elif how == "stale":
        fake_clock.advance(seconds=10)  # past the example's heartbeatStaleMs (3000)
    else:
        domain_transition(domain_id=east.id, to_state="failed", reason="crashed")
    page = fleet_page(seeded_fleet, now=fake_clock.now())
    card = _card(page, "east")
    assert card["report_stale"] and card["report_clock"] == seen.strftime("%H:%M:%S")
    assert card["gpus"]  # still shown, as history

    html = east_card(client.get("/fleets/demo/live/").content.decode())
    assert 'data-report="stale"' in html
    assert f"last report {seen:%H:%M:%S} UTC" in html
    assert f'data-since="{clock.iso(seen)}"' in html
    assert ">awake</span>" not in html and ">was awake</span>" in html
    # The other host answers: its card is current.
    west = _card(page, "west")
    assert not west["report_stale"]


@pytest.mark.django_db
def test_a_host_never_heard_from_has_no_report_to_call_stale(seeded_fleet, fake_clock):
    fake_clock.advance(seconds=60)
    card = _card(fleet_page(seeded_fleet, now=fake_clock.now()), "west")
    assert not card["report_stale"] and card["report_clock"] == ""
