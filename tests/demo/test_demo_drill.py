"""`demo drill` asks the demo's server for a failover drill and follows it to its end; `demo
drill --every N` gives the demo fleet a short drill schedule, as an operator does in admin."""

from __future__ import annotations

import os

import httpx
import pytest

from fleets.core.states import DRILL_STEPS, ROUND_TRIP_DRILL_STEPS
from fleets.models import Fleet
from haru import demo


class ScriptedServer:
    """The demo server's API, scripted: the drill answer, then the operation as it moves."""

    def __init__(self, drill: httpx.Response, states: list[dict], recovery: dict | None = None):
        self.drill = drill
        self.states = list(states)
        self.recovery = recovery or {}
        self.calls: list[tuple[str, str, dict | None]] = []

    def __call__(self, state, method, path, body=None):
        self.calls.append((method, path, body))
        if (method, path) == ("POST", "/fleets/demo/drill"):
            return self.drill
        if method == "GET" and path.startswith("/operations/"):
            return httpx.Response(200, json=self.states.pop(0))
        if (method, path) == ("GET", "/fleets/demo/recovery"):
            return httpx.Response(200, json=self.recovery)
        raise AssertionError(f"unexpected call {method} {path}")


def _op(state: str, step: str | None = None, error: dict | None = None) -> dict:
    return {
        "id": "0d5c1f7a-0000-4000-8000-000000000001",
        "state": state,
        "currentStep": step,
        "targetDomainSlug": "west",
        "error": error,
    }


@pytest.fixture
def no_waiting(monkeypatch):
    monkeypatch.setattr(demo.time, "sleep", lambda s: None)


def test_drill_runs_the_chosen_mode_and_prints_each_step_and_the_published_time(
    monkeypatch, capsys, no_waiting
):
    server = ScriptedServer(
        httpx.Response(202, json={"status": "accepted", "operation": _op("pending")}),
        [_op("running", "stop_training"), _op("running", "wake"), _op("succeeded", "")],
        {"objectiveMs": 300_000, "drill": {"count": 3, "p50Ms": 1200, "p95Ms": 4100}},
    )
    monkeypatch.setattr(demo, "api", server)

    assert demo.main(["drill", "round_trip"]) == 0

    assert server.calls[0] == ("POST", "/fleets/demo/drill", {"mode": "round_trip"})
    out = capsys.readouterr().out
    assert "round_trip drill of west started (operation 0d5c1f7a)" in out
    # Every step of the round trip, also those the 0.3 s poll never saw current.
    assert "".join(f"  {step}\n" for step in ROUND_TRIP_DRILL_STEPS) in out
    assert "the drill passed; routing moved there and back" in out
    assert "over the last 3: p50 1.2s, p95 4.1s (objective 300.0s)" in out


def test_drill_without_a_mode_is_a_check(monkeypatch, capsys, no_waiting):
    server = ScriptedServer(
        httpx.Response(202, json={"status": "accepted", "operation": _op("pending")}),
        [_op("succeeded")],
    )
    monkeypatch.setattr(demo, "api", server)
    assert demo.main(["drill"]) == 0
    assert server.calls[0][2] == {"mode": "check"}
    assert "routing never moved" in capsys.readouterr().out


def test_a_refused_drill_prints_the_apis_message_and_fails(monkeypatch, capsys):
    refused = {"error": {"code": "operation_conflict", "message": "no drill while ..."}}
    server = ScriptedServer(httpx.Response(409, json=refused), [])
    monkeypatch.setattr(demo, "api", server)
    assert demo.main(["drill"]) == 1
    assert "check drill refused (HTTP 409): no drill while ..." in capsys.readouterr().out


def test_a_failed_drill_names_its_step_and_code_and_fails(monkeypatch, capsys, no_waiting):
    error = {"step": "probe", "code": "probe_mismatch", "message": "llama-small: expected"}
    server = ScriptedServer(
        httpx.Response(202, json={"status": "accepted", "operation": _op("pending")}),
        [_op("running", "probe"), _op("failed", "probe", error)],
    )
    monkeypatch.setattr(demo, "api", server)
    assert demo.main(["drill"]) == 1
    out = capsys.readouterr().out
    assert "the drill failed at probe: probe_mismatch: llama-small: expected" in out
    # The steps before the failed one ran, and each is printed once.
    assert "  stop_training\n  verify_gpu\n  wake\n  probe\n" in out
    assert "sleep" not in out.split("failed at")[0]


def test_drill_prints_the_steps_that_passed_between_two_polls(monkeypatch, capsys, no_waiting):
    """`verify_gpu` and `start_training` take milliseconds: the poll never saw them current,
    and `drill` left them out."""
    server = ScriptedServer(
        httpx.Response(202, json={"status": "accepted", "operation": _op("pending")}),
        [_op("running", "stop_training"), _op("running", "probe"), _op("succeeded")],
    )
    monkeypatch.setattr(demo, "api", server)
    assert demo.main(["drill"]) == 0
    out = capsys.readouterr().out
    assert "".join(f"  {step}\n" for step in DRILL_STEPS) in out
    assert out.count("  probe\n") == 1


def test_drill_says_so_when_the_demo_is_not_running(monkeypatch):
    def down(*args, **kwargs):
        raise httpx.ConnectError("connection refused")

    monkeypatch.setattr(demo, "api", down)
    with pytest.raises(SystemExit, match="not answering"):
        demo.main(["drill"])


@pytest.fixture
def demo_shell(monkeypatch, tmp_path):
    """Run the `manage.py shell -c` script the demo sends in this process, on the test database,
    with the environment the demo gives it."""
    monkeypatch.setenv("HARU_VAR_DIR", str(tmp_path / "var"))
    demo.save_state({"run": "r1", "masterKey": "k" * 43})
    sent: list[dict] = []

    def run(args, *, cwd, env, check):
        assert args[1:4] == ["manage.py", "shell", "-c"] and check
        assert env["HARU_SUPERVISOR_MASTER_KEY"] == "k" * 43
        sent.append(env)
        with monkeypatch.context() as m:
            for key in ("DEMO_DRILL_EVERY", "DEMO_DRILL_MODE", "DEMO_FLEET"):
                m.setenv(key, env[key])
            exec(args[4], {"os": os})  # noqa: S102 - the demo's own script, under test

    monkeypatch.setattr(demo.subprocess, "run", run)
    return sent


@pytest.mark.django_db
def test_drill_every_gives_the_demo_fleet_a_short_schedule_and_zero_clears_it(
    seeded_fleet, demo_shell, capsys
):
    Fleet.objects.filter(pk=seeded_fleet.pk).update(
        drill_window_start="02:00", drill_window_end="04:00"
    )
    assert demo.main(["drill", "--every", "1", "round_trip"]) == 0
    fleet = Fleet.objects.get(pk=seeded_fleet.pk)
    assert fleet.drill_interval_minutes == 1 and fleet.drill_mode == "round_trip"
    assert fleet.drill_window_start is None and fleet.drill_window_end is None  # any time
    assert "a round_trip drill every 1 minute(s)" in capsys.readouterr().out

    assert demo.main(["drill", "--every", "0"]) == 0
    fleet.refresh_from_db()
    assert fleet.drill_interval_minutes is None and fleet.drill_mode == "check"


def test_drill_every_refuses_an_interval_out_of_bounds(demo_shell):
    with pytest.raises(SystemExit, match="drill interval must be 1 to"):
        demo.main(["drill", "--every", "999999999"])
    with pytest.raises(SystemExit, match="drill interval must be 1 to"):
        demo.main(["drill", "--every", "-1"])
    assert demo_shell == []
