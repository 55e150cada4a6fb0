"""An operator's script for the `script` driver, as a test runs it: `script_host.py PHASE`.

The "host" is this machine: `launch` starts a real supervisor (`python -m supervisor`, with the
simulated engines of its config) on SCRIPT_HOST_PORT and returns at once; `describe` prints the
JSON object the driver reads; `stop` stops the supervisor and everything it started. State and
a record of each call (its environment and standard input) live in SCRIPT_HOST_DIR/<domain>.
Standard library only: it runs outside Haru, as an operator's script would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

# Run as a script, this file's folder is on sys.path: the fake sky CLI beside it shares its
# process helpers.
from fake_sky import alive, pids_marked


def _home() -> Path:
    home = Path(os.environ["SCRIPT_HOST_DIR"]) / os.environ["HARU_DOMAIN"]
    home.mkdir(parents=True, exist_ok=True)
    return home


def _record(phase: str, stdin: str) -> None:
    with (_home() / "calls.jsonl").open("a") as out:
        out.write(json.dumps({"phase": phase, "env": dict(os.environ), "stdin": stdin}) + "\n")


def _state() -> dict | None:
    path = _home() / "state.json"
    return json.loads(path.read_text()) if path.exists() else None


def launch() -> int:
    token = sys.stdin.readline().strip()
    _record("launch", token)
    if not token:
        print("no token on stdin", file=sys.stderr)
        return 2
    port = os.environ["SCRIPT_HOST_PORT"]
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        "PORT": port,
        "HARU_SUPERVISOR_HOST": "127.0.0.1",
        "HARU_SUPERVISOR_TOKEN": token,
        "HARU_SUPERVISOR_CONFIG": os.environ["HARU_SUPERVISOR_CONFIG"],
        "SCRIPT_HOST_NODE": str(_home()),
    }
    with (_home() / "supervisor.log").open("ab") as log:
        proc = subprocess.Popen(  # noqa: S603 - argv list
            [sys.executable, "-m", "supervisor"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=os.environ.get("SCRIPT_HOST_CWD") or None,
        )
    state = {"pid": proc.pid, "port": int(port), "launchId": os.environ["HARU_LAUNCH_ID"]}
    (_home() / "state.json").write_text(json.dumps(state))
    print(f"launched supervisor pid {proc.pid} on port {port}")
    return 0


def describe() -> int:
    _record("describe", sys.stdin.read())
    state = _state()
    if state is None or not alive(state["pid"]):
        print(json.dumps({"state": "stopped"}))
        return 0
    try:
        socket.create_connection(("127.0.0.1", state["port"]), timeout=1).close()
    except OSError:
        print(json.dumps({"state": "pending", "message": "supervisor starting"}))
        return 0
    print(json.dumps({"state": "up", "supervisorUrl": f"http://127.0.0.1:{state['port']}"}))
    return 0


def stop() -> int:
    _record("stop", sys.stdin.read())
    state = _state()
    if state is not None and alive(state["pid"]):
        with contextlib.suppress(OSError):
            os.killpg(state["pid"], signal.SIGTERM)  # the supervisor stops its children
        deadline = time.monotonic() + 10
        while alive(state["pid"]) and time.monotonic() < deadline:
            time.sleep(0.1)
    for pid in pids_marked("SCRIPT_HOST_NODE", _home()):  # whatever is left
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    (_home() / "state.json").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit({"launch": launch, "describe": describe, "stop": stop}[sys.argv[1]]())
