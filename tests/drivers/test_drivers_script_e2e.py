"""End to end: a `script` domain brought up, heartbeaten and torn down by Haru alone.

The operator's commands are tests/drivers/script_host.py: `launch` starts a real supervisor
(`python -m supervisor`, simulated GPU and engine) on a free loopback port with the token it
reads on its standard input, `describe` answers with its URL once it listens, `stop` stops it.
Everything else is Haru: provisioning passes and reconcile ticks, nothing called by hand between
them but the operator's stop request.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.ports import free_port
from fleets.core.states import DomainState
from fleets.layouts.loader import parse_layout
from fleets.models import Domain, Event, Fleet
from fleets.reconciler.provision import fleet_provision_tick
from fleets.reconciler.tick import tick_run
from fleets.services import provisioning as svc
from fleets.services.layouts import layout_apply

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
HOST = [sys.executable, str(Path(__file__).with_name("script_host.py"))]
MASTER = "script-e2e-master-key-0123456789abcdefgh"


def layout(tmp_path: Path, port: int, model_port: int) -> dict:
    config = {
        "host": "lab",
        "gpu": {"backend": "sim", "simStateFile": str(tmp_path / "sim-gpu.json")},
        "slots": [
            {
                "kind": "inference",
                "gpuIndex": 0,
                "models": [
                    {"name": "qwen-small", "port": model_port, "profile": {"engine": "sim"}}
                ],
            }
        ],
    }
    return {
        "slug": "onprem",
        "activeDomainSlug": "east",
        "domains": [
            {
                "slug": "east",
                "provider": "static",
                "supervisorUrl": "http://127.0.0.1:9",
                "servingBaseUrl": "http://127.0.0.1:9",
                "slots": [{"kind": "inference", "gpuIndex": 0, "models": [{"name": "llama"}]}],
            },
            {
                "slug": "lab",
                "provider": "script",
                "driver": {
                    "launch": [*HOST, "launch"],
                    "describe": [*HOST, "describe"],
                    "stop": [*HOST, "stop"],
                    "envs": {
                        "SCRIPT_HOST_DIR": str(tmp_path / "hosts"),
                        "SCRIPT_HOST_PORT": str(port),
                        "SCRIPT_HOST_CWD": str(ROOT),
                        "PYTHONPATH": os.environ.get("PYTHONPATH") or str(ROOT),
                    },
                    "timeouts": {"launchS": 30, "describeS": 10, "stopS": 30},
                    "supervisorConfig": config,
                },
                "slots": [
                    {
                        "kind": "inference",
                        "gpuIndex": 0,
                        "models": [
                            {"name": "qwen-small", "servingUrl": f"http://127.0.0.1:{model_port}"}
                        ],
                    }
                ],
            },
        ],
    }


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def lab() -> Domain:
    return Domain.objects.get(slug="lab")


def until(predicate, timeout: float, what: str, step) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        step()
        if predicate():
            return
        time.sleep(0.2)
    d = lab()
    raise AssertionError(f"not reached in {timeout}s: {what}: {d.state} {d.driver_status}")


@pytest.fixture
def onprem(db, tmp_path, settings):
    settings.HARU = {**settings.HARU, "supervisor_master_key": MASTER}
    port = free_port()
    layout_apply(layout=parse_layout(layout(tmp_path, port, free_port())))
    yield Fleet.objects.get(slug="onprem"), port
    # Whatever the test left running goes, by the operator's own stop command.
    env = {
        **os.environ,
        "SCRIPT_HOST_DIR": str(tmp_path / "hosts"),
        "HARU_DOMAIN": "lab",
    }
    subprocess.run([*HOST, "stop"], env=env, stdin=subprocess.DEVNULL, check=False, timeout=30)


def test_a_script_domain_comes_up_answers_heartbeats_and_is_torn_down(onprem, tmp_path):
    fleet, port = onprem

    def round_() -> None:
        fleet_provision_tick(fleet_id=fleet.id)
        tick_run(fleet_id=fleet.id, wait_s=2, poll_s=0.2)

    # Launched through the script, described until the supervisor listens, then heartbeaten
    # with the domain's own token (a refused token would never make it ready).
    until(lambda: lab().state == DomainState.READY, 60, "lab ready", round_)
    d = lab()
    assert d.supervisor_url == f"http://127.0.0.1:{port}"
    assert d.last_seen_at is not None
    kinds = list(Event.objects.filter(domain=d).order_by("id").values_list("kind", flat=True))
    assert [k for k in kinds if k.startswith("domain.")][:4] == [
        "domain.provision.replaced",
        "domain.provision.launched",
        "domain.provision.up",
        "domain.ready",
    ], kinds
    home = tmp_path / "hosts" / "lab"
    supervisor_pid = json.loads((home / "state.json").read_text())["pid"]
    assert alive(supervisor_pid)

    # The operator stops it: the pass runs the stop command and confirms with describe.
    svc.domain_stop_request(domain_id=d.id, actor="operator")
    until(lambda: lab().state == DomainState.STOPPED, 60, "lab stopped", round_)
    assert not (home / "state.json").exists()
    assert not alive(supervisor_pid)
    phases = [json.loads(line)["phase"] for line in (home / "calls.jsonl").read_text().splitlines()]
    assert phases[:2] == ["stop", "launch"] and phases[-2:] == ["stop", "describe"]
    assert "domain.stopped" in Event.objects.filter(domain=d).values_list("kind", flat=True)
