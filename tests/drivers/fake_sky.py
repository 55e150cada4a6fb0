#!/usr/bin/env python3
"""A scripted `sky` for tests: records its argv, replays scripted answers, and otherwise
simulates clusters on this machine.

Put on PATH (or at $HARU_SKY_VENV/bin/sky) by `install_fake_sky`. State lives in $FAKE_SKY_DIR:
- calls.jsonl: one line per call, `{"argv": [...], "secrets": {NAME: present?}}` (never values);
- script.json: `{"<subcommand>": [{"rc": 1, "output": "..."}, ...]}`, answers popped in order
  (subcommand: launch, status, endpoint, stop, down, api-status, api-logs, serve-up,
  serve-status, serve-down) before any simulation;
- clusters.json: the simulated clusters.

A simulated `launch` starts the task's run command for real when FAKE_SKY_RUN=1 (the supervisor,
bound to 127.0.0.1 on a free port instead of the task's port, with the task's envs and the secret
taken from this process's environment, as SkyPilot's `--secret NAME` does); otherwise it only
records the cluster as UP. Output shapes follow SkyPilot 0.14 (docs/drivers.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import yaml

STATE = Path(os.environ.get("FAKE_SKY_DIR", "."))


def _load(name: str, default):
    path = STATE / name
    return json.loads(path.read_text()) if path.exists() else default


def _save(name: str, value) -> None:
    tmp = STATE / f".{name}.{os.getpid()}"
    tmp.write_text(json.dumps(value, indent=1))
    tmp.replace(STATE / name)


def _scripted(kind: str):
    script = _load("script.json", {})
    answers = script.get(kind) or []
    if not answers:
        return None
    answer = answers.pop(0)
    _save("script.json", script)
    return answer


def _free_port() -> int:
    # The launcher's helper (a port outside the ephemeral range, common/ports.py), from the
    # checkout this script was copied out of: FAKE_SKY_CWD is its root.
    sys.path.insert(0, os.environ.get("FAKE_SKY_CWD") or ".")
    from common.ports import free_port  # noqa: PLC0415 - this script is copied out of the repo

    return free_port()


def _status_record(name: str, c: dict) -> dict:
    # The keys `sky status -o json` prints (StatusResponse minus handle and credentials).
    return {
        "name": name,
        "launched_at": c["launched_at"],
        "last_use": "sky launch",
        "status": c["status"],
        "autostop": -1,
        "to_down": False,
        "owner": None,
        "metadata": {},
        "cluster_hash": c["hash"],
        "cluster_ever_up": True,
        "status_updated_at": int(time.time()),
        "user_hash": "abcd1234",
        "user_name": "haru",
        "config_hash": None,
        "workspace": "default",
        "last_creation_yaml": None,
        "last_creation_command": None,
        "is_managed": False,
        "last_event": None,
        "init_kind": None,
        "init_status_reason": None,
        "resources_str": c["resources"],
        "resources_str_full": c["resources"],
        "nodes": 1,
        "cloud": c["cloud"],
        "region": c["region"],
        "cpus": "8",
        "memory": "64",
        "accelerators": c["accelerators"],
        "labels": {},
        "cluster_name_on_cloud": f"{name}-{c['hash'][:4]}",
        "node_names": None,
        "priority": None,
        "priority_class": None,
        "links": None,
    }


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    # A zombie is dead for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def pids_marked(variable: str, marker: object) -> list[int]:
    """The processes of one simulated host: the supervisor's children run in sessions of their
    own, so they are found by the marker (`variable=marker`) they inherit in their environment.
    script_host.py, the script driver's host, finds its own the same way."""
    needle = f"{variable}={marker}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes():
                    out.append(int(entry.name))
    return out


def _kill(c: dict) -> None:
    """The node goes away: its supervisor and everything it started."""
    pid = c.get("pid")
    if pid:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        c["pid"] = None
    if c.get("node"):
        for other in pids_marked("FAKE_SKY_NODE", c["node"]):
            with contextlib.suppress(OSError):
                os.kill(other, signal.SIGKILL)


def _launch(args: list[str]) -> int:
    cluster = args[args.index("-c") + 1] if "-c" in args else args[args.index("-n") + 1]
    names = [args[i + 1] for i, a in enumerate(args) if a == "--secret"]
    secrets = {}
    for name in names:
        if name not in os.environ:
            print(f"Usage: sky launch ...\nError: {name} is not set in local environment.")
            return 2
        secrets[name] = os.environ[name]
    task = yaml.safe_load(Path(args[-1]).read_text())
    infra = task["resources"]["infra"].split("/")
    clusters = _load("clusters.json", {})
    c = clusters.get(cluster) or {
        "launched_at": int(time.time()),
        "hash": uuid.uuid4().hex,
    }
    _kill(c)
    c.update(
        status="UP",
        cloud=infra[0].upper(),  # SkyPilot prints the cloud as AWS, GCP, ...
        region=infra[1] if len(infra) > 1 else None,
        accelerators=task["resources"].get("accelerators"),
        resources=f"1x {infra[0].upper()}(...)",
        ports={},
        launches=c.get("launches", 0) + 1,
    )
    if os.environ.get("FAKE_SKY_RUN") == "1":
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_SKY")}
        env.update({k: str(v) for k, v in (task.get("envs") or {}).items()})
        env.update(secrets)
        port = _free_port()
        c["ports"] = {str(env.get("PORT", "8701")): port}
        env["PORT"] = str(port)
        env["HARU_SUPERVISOR_HOST"] = "127.0.0.1"  # loopback only: this is a test machine
        c["node"] = f"{STATE}/{cluster}/{c['launches']}"
        env["FAKE_SKY_NODE"] = c["node"]  # inherited by every process of this node
        # ... the supervisor's children included: they get an allow-list of its environment
        # (supervisor/child_env.py), and a node's engines must die with it.
        allowed = env.get("HARU_CHILD_ENV_ALLOW", "")
        env["HARU_CHILD_ENV_ALLOW"] = ",".join(filter(None, [allowed, "FAKE_SKY_NODE"]))
        log = open(STATE / f"{cluster}.log", "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(  # noqa: S603
            task["run"].replace("exec ", "", 1).split(),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=os.environ.get("FAKE_SKY_CWD") or None,
        )
        c["pid"] = proc.pid
    clusters[cluster] = c
    _save("clusters.json", clusters)
    kind = "sky.serve.up" if args[0] == "serve" else "sky.launch"
    print(f"Submitted {kind} request: {uuid.uuid4()}")
    print("├── Check logs with: sky api logs <id>")
    return 0


def main(argv: list[str]) -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    present = {}
    for i, a in enumerate(argv):
        if a == "--secret":
            present[argv[i + 1]] = argv[i + 1] in os.environ
    with open(STATE / "calls.jsonl", "a") as f:
        f.write(json.dumps({"argv": argv, "secrets": present}) + "\n")
    kind = argv[0] if argv else ""
    if kind in ("api", "serve"):
        kind = f"{argv[0]}-{argv[1]}"
    if kind == "status" and "--endpoint" in argv:
        kind = "endpoint"
    answer = _scripted(kind)
    if answer is not None:
        print(answer.get("output", ""))
        return int(answer.get("rc", 0))
    clusters = _load("clusters.json", {})
    if kind in ("launch", "serve-up"):
        return _launch(argv[1:] if kind == "launch" else argv[2:])
    if kind == "status":
        name = argv[-1]
        c = clusters.get(name)
        if c is not None and c["status"] == "UP" and c.get("ports") and not alive(c.get("pid")):
            # The cloud lost the node (or its job died): a refresh says so.
            c["status"] = "INIT"
            _save("clusters.json", clusters)
        print(json.dumps([_status_record(name, c)] if c else [], indent=2))
        return 0
    if kind == "endpoint":
        port, name = argv[argv.index("--endpoint") + 1], argv[-1]
        c = clusters.get(name)
        if c is None or c["status"] != "UP":
            print(f"RuntimeError: Cluster {name!r} is not in UP status.")
            return 1
        print(f"127.0.0.1:{c['ports'].get(port, port)}")
        return 0
    if kind in ("stop", "down"):
        name = argv[-1]
        c = clusters.get(name)
        if c is None:
            print(f"Cluster(s) not found (tip: see `sky status`). {name}")
            return 1
        _kill(c)
        if kind == "down":
            del clusters[name]
        else:
            c["status"] = "STOPPED"
        _save("clusters.json", clusters)
        print(f"Cluster {name} {'terminated' if kind == 'down' else 'stopped'}.")
        return 0
    if kind == "api-status":
        rid = argv[-1]
        print(json.dumps([{"request_id": rid, "name": "sky.launch", "status": "SUCCEEDED"}]))
        return 0
    if kind == "api-logs":
        print("Launching...\nJob submitted.")
        return 0
    print(f"fake sky: no simulation for {argv!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
