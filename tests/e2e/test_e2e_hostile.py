"""Issue 29's hostile-client suite: every attack on the HTTP edge, at once against the control
plane's server and the active's supervisor of a running fleet, while a normal client is served.

A real fleet (server with its reconcile loop, east active, west standby, fast failover policy:
heartbeats stale after 1.5 s, degraded grace 3 s) and, for each attack (issue 29's four and issue
11's three), a few hundred connections from 127.0.0.2 at the server and as many at east's
supervisor, held and reopened as they close, for a few seconds each. Both edges run with their
connection caps lowered below the flood (the server's to 128, the supervisor's to 96) and the
per-address cap at the defaults' share of it (an eighth for the server, half for the
supervisor). Each phase's own bound is tested alone in tests/server/test_server_hostile_edges.py
and tests/supervisor/test_supervisor_edges.py; here they hold together. Asserted: the normal
client on 127.0.0.1 (healthz, an API read, a chat completion, and the supervisor's authenticated
status) is served in every round, and no failover happens.
"""

from __future__ import annotations

import time

import httpx
import pytest

from bench.hostile_clients import raise_own_nofile
from bench.hostile_floods import Flood, Rounds, attacks

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

CONNECTIONS = 300  # per attack and target
SERVER_CAP = 128
SUPERVISOR_CAP = 96
SECONDS_PER_ATTACK = 3.0
ROUND_S = 0.5


def probes(server, east) -> dict:
    api = {"Authorization": f"Bearer {server.api_token}"}
    chat = {**api, "X-Haru-Fleet": "e2e"}
    supervisor = {"Authorization": f"Bearer {east.token}"}
    body = {"model": "qwen-small", "messages": [{"role": "user", "content": "hi"}]}

    def get(url: str, headers: dict | None = None) -> bool:
        return httpx.get(url, headers=headers, timeout=3, trust_env=False).status_code == 200

    return {
        "server /healthz": lambda: get(f"{server.url}/healthz"),
        "server /v1/fleets/e2e": lambda: get(f"{server.url}/v1/fleets/e2e", api),
        "chat": lambda: (
            httpx.post(
                f"{server.url}/v1/chat/completions", json=body, headers=chat, timeout=5
            ).status_code
            == 200
        ),
        "supervisor /v1/status": lambda: get(f"{east.url}/v1/status", supervisor),
    }


def test_every_attack_leaves_a_normal_client_served_and_the_fleet_where_it_is(served, monkeypatch):
    raise_own_nofile(4 * CONNECTIONS + 512)
    monkeypatch.setenv("HARU_SUPERVISOR_HTTP_MAX_CONNECTIONS", str(SUPERVISOR_CAP))
    monkeypatch.setenv("HARU_SUPERVISOR_HTTP_MAX_CONNECTIONS_PER_ADDRESS", str(SUPERVISOR_CAP // 2))
    east, _west, server = served(
        server_env={
            "HARU_HTTP_MAX_CONNECTIONS": str(SERVER_CAP),
            "HARU_HTTP_MAX_CONNECTIONS_PER_ADDRESS": str(SERVER_CAP // 8),
        }
    )
    at_server = attacks(post_path="/v1/fleets/e2e/reconcile")
    at_supervisor = attacks(post_path="/v1/probe")
    server_address = ("127.0.0.1", server.port)
    east_address = ("127.0.0.1", east.port)
    rounds = Rounds(probes(server, east), period_s=ROUND_S)
    rounds.run_once()
    assert rounds.failures == [], "not served before any attack"
    seen: dict[str, dict] = {}
    for name in at_server:
        with (
            Flood(server_address, at_server[name], CONNECTIONS) as on_server,
            Flood(east_address, at_supervisor[name], CONNECTIONS) as on_east,
        ):
            deadline = time.monotonic() + SECONDS_PER_ATTACK
            while time.monotonic() < deadline:
                started = time.monotonic()
                rounds.run_once()
                time.sleep(max(0.0, ROUND_S - (time.monotonic() - started)))
            seen[name] = {
                "opened": (on_server.opened, on_east.opened),
                "statuses": (dict(on_server.statuses), dict(on_east.statuses)),
            }
        assert on_server.opened >= CONNECTIONS and on_east.opened >= CONNECTIONS, seen[name]
        assert rounds.failures == [], (name, rounds.failures, seen)

    operations = server.api("GET", "/fleets/e2e/operations").json()["operations"]
    assert [o for o in operations if o["reason"] == "auto_failover"] == []
    intent = server.api("GET", "/fleets/e2e/route-intent").json()
    assert intent["active"]["domainSlug"] == "east"
