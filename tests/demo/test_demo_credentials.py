"""The demo runs on per-host supervisor tokens: no shared token, so no haru.W002 (issue 11)."""

from __future__ import annotations

import sqlite3
import subprocess

import pytest

from fleets.core.credentials import derive_supervisor_token
from haru import demo


@pytest.fixture
def demo_state(tmp_path, monkeypatch):
    monkeypatch.setenv("HARU_VAR_DIR", str(tmp_path / "var"))
    # A shared token or a key in the caller's shell must not leak into the demo's processes.
    monkeypatch.setenv("HARU_SUPERVISOR_TOKEN", "from-the-shell-0123456789abcdef")
    monkeypatch.setenv("HARU_SUPERVISOR_MASTER_KEY", "shell-key-0123456789abcdef")
    monkeypatch.delenv("DATABASE_URL", raising=False)
    return {"run": "r1", "masterKey": "demo-master-key-0123456789abcdefghij"}


def _manage(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [demo.PYTHON, "manage.py", *args],
        cwd=demo.REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


@pytest.mark.integration
def test_the_demo_seeds_with_a_master_key_and_gives_each_host_its_own_token(demo_state, tmp_path):
    env = demo.control_env(demo_state)
    assert env["HARU_SUPERVISOR_MASTER_KEY"] == demo_state["masterKey"]
    assert "HARU_SUPERVISOR_TOKEN" not in env
    _manage(env, "migrate", "--noinput", "-v0")
    seeded = _manage(env, "seed_layout", "--config", demo.LAYOUT)
    assert "haru.W002" not in seeded.stdout + seeded.stderr
    checked = _manage(env, "check")
    assert "haru.W002" not in checked.stdout + checked.stderr

    tokens = demo.host_tokens(env)
    with sqlite3.connect(tmp_path / "var" / "haru.sqlite3") as db:
        ids = dict(db.execute("SELECT slug, id FROM fleets_domain").fetchall())
    assert set(tokens) == set(demo.HOSTS) == set(ids)
    for name, token in tokens.items():
        assert token == derive_supervisor_token(demo_state["masterKey"], ids[name])
    assert tokens["east"] != tokens["west"]

    # Each supervisor holds its own token and never the master key.
    state = {**demo_state, "hostTokens": tokens}
    for name in demo.HOSTS:
        sup = demo.supervisor_env(state, name)
        assert sup["HARU_SUPERVISOR_TOKEN"] == tokens[name]
        assert "HARU_SUPERVISOR_MASTER_KEY" not in sup


def test_a_state_without_host_tokens_asks_for_a_fresh_demo(demo_state):
    with pytest.raises(SystemExit, match="no token for east"):
        demo.supervisor_env(demo_state, "east")
