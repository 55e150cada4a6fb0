"""The local launcher's own helpers (haru/local/): free ports outside the ephemeral range, and a
wait that gives up as soon as the process it waits for has exited."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from common import ports
from haru.local.processes import Processes, exited, spawn, stop, wait_for


def test_free_ports_lie_outside_the_kernels_ephemeral_range_and_are_never_repeated():
    low, high = ports.ephemeral_range()
    given = [ports.free_port() for _ in range(100)]
    assert len(set(given)) == len(given)
    assert not [port for port in given if low <= port <= high]
    assert min(given) >= ports.FIRST


def test_a_port_someone_listens_on_is_passed_over(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        offered = iter([busy, 23456, 23457, 23458])
        monkeypatch.setattr(ports, "_given", set())
        monkeypatch.setattr(ports.random, "choice", lambda pool: next(offered))
        assert ports.free_port() != busy


@pytest.mark.parametrize(
    ("kernel_range", "expected"),
    [
        ("32768\t60999\n", range(20000, 32768)),  # Linux's default: the stretch below
        ("10000 60999", range(61000, 65536)),  # a range starting low: the stretch above
        ("20000 29999", range(30000, 65536)),  # the wider of the two
        ("1024 65535", range(0)),  # nothing outside: free_port asks the kernel
    ],
)
def test_the_candidates_are_the_widest_stretch_outside_the_range(
    tmp_path, monkeypatch, kernel_range, expected
):
    path = tmp_path / "ip_local_port_range"
    path.write_text(kernel_range)
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", path)
    assert ports.candidates() == expected


def test_an_unreadable_range_falls_back_to_linuxs_default(tmp_path, monkeypatch):
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "missing")
    assert ports.ephemeral_range() == (32768, 60999)


def test_with_no_room_outside_the_range_the_kernel_picks(tmp_path, monkeypatch):
    path = tmp_path / "ip_local_port_range"
    path.write_text("1024 65535")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", path)
    assert 0 < ports.free_port() < 65536


def test_a_wait_for_a_process_that_exited_fails_at_once_with_its_log(tmp_path):
    log = tmp_path / "child.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.exit('cannot listen: address in use')"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    proc.wait(10)
    started = time.monotonic()
    with pytest.raises(AssertionError) as failure:
        wait_for(lambda: False, 30, "the child up", gave_up=exited(proc, log))
    assert time.monotonic() - started < 5  # not the 30 s deadline
    assert "exited with status 1" in str(failure.value)
    assert "cannot listen: address in use" in str(failure.value)


def test_a_wait_for_a_running_process_waits_as_before(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ready = iter([False, False, True])
        assert wait_for(
            lambda: next(ready),
            10,
            "third poll",
            every=0.01,
            gave_up=exited(proc, tmp_path / "none.log"),
        )
    finally:
        proc.kill()
        proc.wait(10)


def test_a_stop_that_sigterm_does_not_end_kills_the_group_after_the_grace(tmp_path):
    ignores = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    proc = spawn([sys.executable, "-c", ignores], env={}, log=tmp_path / "stubborn.log")
    time.sleep(0.5)  # its handler is installed
    started = time.monotonic()
    stop(proc, grace_s=1)
    assert proc.poll() == -signal.SIGKILL
    assert time.monotonic() - started < 10


def test_cleanup_kills_the_groups_it_started_and_the_processes_it_adopted(tmp_path):
    procs = Processes(tmp_path)
    leader = procs.start("leader", [sys.executable, "-c", "import time; time.sleep(60)"], env={})
    # A child in a session of its own, as a supervisor's engines are: the leader's group does
    # not reach it, only its adoption does.
    orphan = subprocess.Popen(["sleep", "60"], start_new_session=True)
    procs.adopt([orphan.pid])
    procs.cleanup(grace_s=2)
    assert leader.poll() is not None
    assert orphan.wait(5) == -signal.SIGKILL
