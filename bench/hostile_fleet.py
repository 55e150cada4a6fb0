"""Issue 29's floods against a running simulated fleet: bench/hostile_inputs.py's `--floods`.

Starts a stack like `make demo` (two simulated hosts from the local launcher, east active and
west standby, and `manage.py serve` with its reconcile loop), then per target (the server, then
east's supervisor) runs every one of bench/hostile_floods.NEW_ATTACKS at once, `connections` of
each from 127.0.0.2, held and reopened as they close, for `seconds`, while a normal client on
127.0.0.1 probes once a second. Per target: rounds served of total, the server's and the
supervisor's resident memory growth (peak over the run less before it), and failovers (automatic
failover operations, and moves of the route off east).
"""

from __future__ import annotations

import json
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.hostile_clients import PeakRss, raise_own_nofile
from bench.hostile_floods import NEW_ATTACKS, Flood, Rounds, attacks
from haru.local.layouts import FAST_POLICY, fleet_layout
from haru.local.server import ServerProc
from haru.local.supervisors import SimHost, put_in_standby_posture

# The launcher's fast step budgets, with a stale window short enough that a supervisor that
# stopped answering would be failed over within the run (the saw it after 9 s).
POLICY = {**FAST_POLICY, "heartbeatStaleMs": 5000, "degradedGraceMs": 5000}
TICK_S = 0.5


class Fleet:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.east = SimHost("east", workdir)
        self.west = SimHost("west", workdir, start_asleep=True)
        self.server = ServerProc(workdir, env={"HARU_RECONCILE_INTERVAL_MS": "500"})

    def start(self) -> None:
        self.east.start()
        self.west.start()
        put_in_standby_posture(self.west)
        path = self.workdir / "layout.json"
        path.write_text(json.dumps(fleet_layout(self.east, self.west, POLICY)))
        self.server.manage("migrate", "--noinput", "-v0")
        self.server.manage("seed_layout", "--config", str(path))
        self.server.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            domains = self.server.api("GET", "/fleets/e2e").json()["domains"]
            if all(d["lastSeenAt"] for d in domains):
                return
            time.sleep(0.5)
        raise RuntimeError("no heartbeats from the supervisors")

    def stop(self) -> None:
        self.server.kill(signal.SIGTERM)
        for host in (self.east, self.west):
            host.crash()

    def failovers(self) -> tuple[int, str]:
        operations = self.server.api("GET", "/fleets/e2e/operations").json()["operations"]
        intent = self.server.api("GET", "/fleets/e2e/route-intent").json()
        auto = sum(o["reason"] == "auto_failover" for o in operations)
        return auto, intent["active"]["domainSlug"]

    def probes(self) -> dict[str, Any]:
        api = {"Authorization": f"Bearer {self.server.api_token}"}
        body = {"model": "qwen-small", "messages": [{"role": "user", "content": "hi"}]}
        server, east = self.server.url, self.east.url
        supervisor = {"Authorization": f"Bearer {self.east.token}"}

        def ok(response: httpx.Response) -> bool:
            return response.status_code == 200

        return {
            "server /healthz": lambda: ok(httpx.get(f"{server}/healthz", timeout=3)),
            "chat": lambda: ok(
                httpx.post(
                    f"{server}/v1/chat/completions",
                    json=body,
                    headers={**api, "X-Haru-Fleet": "e2e"},
                    timeout=5,
                )
            ),
            "supervisor /v1/status": lambda: ok(
                httpx.get(f"{east}/v1/status", headers=supervisor, timeout=3)
            ),
        }


def hostile_sources(count: int) -> tuple[str, ...]:
    """`count` attacker addresses from 127.0.0.2 on (127.0.0.1 is the normal client's)."""
    if not 1 <= count <= 250:
        raise ValueError(f"--sources takes 1 to 250 addresses, not {count}")
    return tuple(f"127.0.0.{2 + k}" for k in range(count))


def run_target(
    fleet: Fleet,
    target: str,
    *,
    connections: int,
    seconds: float,
    reopen_per_s: int,
    sources: int = 1,
) -> dict[str, Any]:
    if target == "server":
        address = ("127.0.0.1", fleet.server.port)
        kinds = attacks(post_path="/v1/fleets/e2e/reconcile")
    else:
        address = ("127.0.0.1", fleet.east.port)
        kinds = attacks(post_path="/v1/probe")
    failovers_before, _ = fleet.failovers()
    assert fleet.server.proc is not None and fleet.east.proc is not None
    floods = [
        Flood(
            address,
            kinds[name],
            connections,
            source=hostile_sources(sources),
            tick_s=TICK_S,
            reopen=int(reopen_per_s * TICK_S),
        )
        for name in NEW_ATTACKS
    ]
    rounds = Rounds(fleet.probes(), period_s=1.0)
    server_rss = PeakRss(fleet.server.proc.pid, 0.2)
    sup_rss = PeakRss(fleet.east.proc.pid, 0.2)
    with server_rss, sup_rss:
        for flood in floods:
            flood.__enter__()
        try:
            with rounds:
                time.sleep(seconds)
        finally:
            for flood in floods:
                flood.__exit__(None, None, None)
    failovers_after, active = fleet.failovers()
    return {
        "target": target,
        "connections_per_attack": connections,
        "source_addresses": sources,
        "seconds": seconds,
        "rounds_served": rounds.served,
        "rounds_total": rounds.total,
        "failed_rounds": rounds.failures[:10],
        "server_rss_growth_mib": round(server_rss.grew_mib, 1),
        "supervisor_rss_growth_mib": round(sup_rss.grew_mib, 1),
        "failovers": failovers_after - failovers_before + (active != "east"),
        "active_after": active,
        "attacks": {
            name: {
                "opened": flood.opened,
                "refused_at_connect": flood.refused,
                "closed_by_peer": flood.closed_by_server,
                "statuses": dict(flood.statuses),
            }
            for name, flood in zip(NEW_ATTACKS, floods, strict=True)
        },
    }


def run(
    *, connections: int, seconds: float, reopen_per_s: int, sources: int = 1
) -> list[dict[str, Any]]:
    raise_own_nofile(len(NEW_ATTACKS) * connections + 1024)
    with tempfile.TemporaryDirectory(prefix="haru-hostile-") as tmp:
        fleet = Fleet(Path(tmp))
        try:
            fleet.start()
            sizes = {
                "connections": connections,
                "seconds": seconds,
                "reopen_per_s": reopen_per_s,
                "sources": sources,
            }
            return [run_target(fleet, target, **sizes) for target in ("server", "supervisor")]
        finally:
            fleet.stop()


def report(results: list[dict[str, Any]]) -> None:
    for r in results:
        print(
            f"{r['target']:<11} {len(NEW_ATTACKS)} attacks x {r['connections_per_attack']} "
            f"connections from {r['source_addresses']} address(es), {r['seconds']:g} s: "
            f"rounds served {r['rounds_served']}/"
            f"{r['rounds_total']}, server RSS +{r['server_rss_growth_mib']} MiB, supervisor RSS "
            f"+{r['supervisor_rss_growth_mib']} MiB, failovers {r['failovers']} "
            f"(active after: {r['active_after']})"
        )
        for name, a in r["attacks"].items():
            print(
                f"    {name:<17} opened {a['opened']:>7}  refused at connect "
                f"{a['refused_at_connect']:>6}  closed by peer {a['closed_by_peer']:>7}  "
                f"answers {a['statuses']}"
            )
        for failure in r["failed_rounds"]:
            print(f"    failed {failure}")
