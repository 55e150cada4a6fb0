"""The demo signals only what it started, and its commands follow the fleet's current roles."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from haru import demo
from supervisor.records import ProcessStamp, StateDir, TrainerRecord


@pytest.fixture
def demo_var(tmp_path, monkeypatch):
    """The demo's var dir and each host's supervisor state dir, all under tmp_path."""
    monkeypatch.setenv("HARU_VAR_DIR", str(tmp_path / "var"))
    monkeypatch.setattr(demo, "host_state_dir", lambda name: tmp_path / "state" / name)
    return tmp_path


@pytest.fixture
def sleepers():
    """Start `sleep` processes in sessions of their own, as the demo's children are."""
    procs: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def gone(proc: subprocess.Popen, within_s: float = 5.0) -> bool:
    try:
        proc.wait(within_s)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_stop_kills_what_the_demo_and_its_supervisors_recorded_and_nothing_else(demo_var, sleepers):
    server, trainer, stranger = sleepers(), sleepers(), sleepers()
    demo.record_started("server", server)
    state = StateDir(demo.host_state_dir("west"))
    state.path.mkdir(parents=True)
    state.save(TrainerRecord(0, ("trainer",), time.time(), ProcessStamp.of(trainer.pid)))

    assert demo.main(["stop"]) == 0

    assert gone(server) and gone(trainer)
    assert stranger.poll() is None  # started by someone else: never touched


def test_crash_of_one_host_leaves_the_other_host_running(demo_var, sleepers):
    east, west = sleepers(), sleepers()
    demo.record_started("east", east)
    demo.record_started("west", west)

    assert demo.main(["crash", "east"]) == 0

    assert gone(east)
    assert west.poll() is None


def test_a_recorded_pid_now_held_by_another_process_is_not_signalled(demo_var, sleepers):
    other = sleepers()
    stamp = ProcessStamp.of(other.pid)
    # The record names the pid, but with another start time: the pid was reused since.
    record = {**stamp.to_json(), "procStartTime": str(int(stamp.start_time) - 1)}
    (demo.pid_dir() / "server.json").write_text(json.dumps(record))

    assert demo.main(["stop"]) == 0

    assert other.poll() is None
    assert not (demo.pid_dir() / "server.json").exists()  # a dead record is dropped


FLEET_WEST_ACTIVE = {
    "domains": [{"slug": "east", "role": "standby"}, {"slug": "west", "role": "active"}]
}


def test_active_and_standby_name_the_hosts_by_the_current_routing_pointer():
    assert demo.resolve_host("active", FLEET_WEST_ACTIVE) == "west"
    assert demo.resolve_host("standby", FLEET_WEST_ACTIVE) == "east"
    assert demo.resolve_host("east", None) == "east"  # a host name needs no server


def test_a_role_without_a_server_asks_for_a_host_name():
    with pytest.raises(SystemExit, match="name the host instead"):
        demo.resolve_host("active", None)


def test_instructions_name_the_current_active(demo_var, capsys):
    demo.print_instructions(FLEET_WEST_ACTIVE)
    out = capsys.readouterr().out
    assert "Right now west is active and east is the standby." in out
    assert "haru.demo crash active" in out
    assert "haru.demo restore west" in out
    assert '"targetDomainId": "east"' in out


def test_the_demo_never_scans_other_processes():
    source = Path(demo.__file__).read_text()
    assert "/proc" not in source
