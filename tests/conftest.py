"""Shared fixtures: the seeded example fleet, an API client, markers for real services."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import pytest
from django.db import connection
from rest_framework.test import APIClient

from fleets.base import clock
from fleets.layouts.loader import parse_layout
from fleets.models import Fleet
from fleets.reconciler import kick
from fleets.reconciler.supervisor import transport
from fleets.services.layouts import layout_apply
from tests.clocks import FakeClock

# The per-fleet access tests' fixtures (a second fleet, a fresh denial window), for every folder.
pytest_plugins = ["tests.access_fixtures"]

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_LAYOUT = ROOT / "examples" / "fleet.two-domain.json"


def pytest_collection_modifyitems(config, items):
    on_postgres = (os.environ.get("DATABASE_URL") or "").startswith("postgres")
    has_redis = bool(os.environ.get("REDIS_URL"))
    skip_pg = pytest.mark.skip(reason="needs DATABASE_URL pointing at PostgreSQL")
    skip_redis = pytest.mark.skip(reason="needs REDIS_URL")
    for item in items:
        if "postgres" in item.keywords and not on_postgres:
            item.add_marker(skip_pg)
        if "redis" in item.keywords and not has_redis:
            item.add_marker(skip_redis)


@pytest.fixture(autouse=True)
def _tick_driver_kept():
    """A test that chooses a tick driver (or starts a server's) leaves the process's as it was."""
    before = kick.driver()
    yield
    kick.drive(before)


@pytest.fixture
def real_transport():
    """The process-wide supervisor client with its real transport (none injected): for tests
    that reach a real server, TLS and pins included."""
    previous = transport.use_transport(None)
    yield
    transport.use_transport(previous)


@pytest.fixture
def layout_data():
    """Return the two-domain example layout as a fresh dict."""

    return json.loads(EXAMPLE_LAYOUT.read_text())


@pytest.fixture
def seeded_fleet(db, layout_data):
    """Apply the two-domain example layout and return the Fleet."""

    layout_apply(layout=parse_layout(layout_data))
    return Fleet.objects.get(slug=layout_data["slug"])


API_TOKEN = "test-token-7f3a-0123456789abcdefghijklmn"


@pytest.fixture
def api_client():
    return APIClient()


@pytest.fixture
def api_token(settings):
    """Configure HARU_API_TOKEN for the test and return it (as long as a deployment needs:
    fleets/checks.py refuses a shorter one)."""
    token = API_TOKEN
    settings.HARU = {**settings.HARU, "api_token": token}
    return token


@pytest.fixture
def fake_clock():
    fake = FakeClock()
    previous = clock.set_clock(fake)
    yield fake
    clock.set_clock(previous)


@pytest.fixture
def vendor():
    return connection.vendor


class FakeSky:
    """The scripted `sky` of tests/drivers/fake_sky.py, installed as `<venv>/bin/sky`."""

    def __init__(self, root: Path) -> None:
        self.venv = root / "sky-venv"
        self.state = root / "sky-state"
        (self.venv / "bin").mkdir(parents=True)
        self.state.mkdir()
        source = (ROOT / "tests" / "drivers" / "fake_sky.py").read_text()
        sky = self.venv / "bin" / "sky"
        sky.write_text(f"#!{sys.executable}\n{source}")
        sky.chmod(0o755)
        self.environ = {
            "PATH": f"{self.venv / 'bin'}:{os.environ.get('PATH', '')}",
            "FAKE_SKY_DIR": str(self.state),
            "FAKE_SKY_CWD": str(ROOT),
        }

    def script(self, kind: str, *answers: dict) -> None:
        """Queue answers (`{"rc": ..., "output": ...}`) for the next calls of `kind`."""
        path = self.state / "script.json"
        script = json.loads(path.read_text()) if path.exists() else {}
        script.setdefault(kind, []).extend(answers)
        path.write_text(json.dumps(script))

    def calls(self) -> list[dict]:
        path = self.state / "calls.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def clusters(self) -> dict:
        path = self.state / "clusters.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def node_pids(self, cluster: str | None = None) -> list[int]:
        """Live processes of the simulated nodes (all, or one cluster's), found by the marker
        the fake puts in their environment."""
        needle = f"FAKE_SKY_NODE={self.state}/{cluster + '/' if cluster else ''}".encode()
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                with contextlib.suppress(OSError):
                    if needle in (entry / "environ").read_bytes():
                        out.append(int(entry.name))
        return out

    def kill_node(self, cluster: str | None = None) -> None:
        """SIGKILL a simulated node's processes (all nodes by default): the machine is gone."""
        for pid in self.node_pids(cluster):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def kill_all(self) -> None:
        self.kill_node()


@pytest.fixture
def fake_sky(tmp_path):
    """A scripted `sky` CLI in a throwaway venv; simulated clusters are killed afterwards."""
    sky = FakeSky(tmp_path)
    yield sky
    sky.kill_all()
