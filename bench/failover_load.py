"""Failover under load: what clients calling the proxy with no retries see.

    .venv/bin/python bench/failover_load.py [-n 3] [--kinds crash,planned,supervisor,supervisor-off]
                                            [--quick] [--jitter-minutes 10]
    .venv/bin/python bench/failover_load.py --streams 200 [--tokens 300] [--json]

Starts a real stack like `make demo`: two simulated hosts (supervisor + two sim engines + sim
trainer each, from the local launcher) and `manage.py serve` (chat proxy + the in-process reconcile
loop, embedded SQLite). Eight client loops (half streaming) call the proxy with the official
OpenAI SDK (`max_retries=0`) the whole time, alternating the two models. Kinds:

- crash: SIGKILL the active's supervisor and model servers; automatic failover follows.
- planned: a manual promotion of the standby (the old active sleeps through its drain).
- supervisor / supervisor-off: SIGKILL only the active's supervisor (its model servers stay up),
  with autoFailover on / off; the supervisor comes back after `--supervisor-down-s`. Neither
  fails over: the data path decides (docs/operations.md), so both measure serving through it.

Per kind it prints requests failed of total (all requests started in the rounds' windows, and those
started after the event), the client-visible outage (from the event to the end of the last failed
request started after it, or the longest wait, from the event on, of a request started before the
routing commit, whichever is longer; p50 and p95 over rounds), the wait of requests started between
the event and the routing commit (the hold time, p50 / p95), and for failovers detection (event ->
promotion requested), the recorded outage (failoverMs), wake, probe, switch and the control-plane
overhead (outage - detection - wake - probe). `--jitter-minutes` instead runs the
stack for that long with every supervisor answer delayed by up to half the stale window (a TCP
relay in front of each supervisor) and reports false failovers (the target is none).

`--streams N` instead runs the stream-continuation run (bench/failover_streams.py): N long
streams in flight when the active host's processes are killed, each checked against an
uninterrupted baseline.

Routing holds and forwards only with the proxy's hold-and-forward; without it, crash failovers
fail requests until routing commits, and the figures say so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from openai import APIStatusError, OpenAI  # noqa: E402

from common.ports import free_port, port_free  # noqa: E402

# The local launcher runs simulated hosts and the server on free ports.
from haru.local.layouts import FAST_POLICY, fleet_layout  # noqa: E402
from haru.local.processes import wait_for  # noqa: E402
from haru.local.server import ServerProc  # noqa: E402
from haru.local.supervisors import TOKEN, SimHost, put_in_standby_posture  # noqa: E402

MODELS = ("llama-small", "qwen-small")
KINDS = ("crash", "planned", "supervisor", "supervisor-off")
CLIENTS = 8
# The fleet's policy: the launcher's fast step budgets (a 3 s degraded grace, which a
# supervisor-less active whose model servers serve outlasts without a failover), but the default
# stale window: detection must not rest on a short one.
POLICY = {**FAST_POLICY, "heartbeatStaleMs": 30_000}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class Req:
    started: float
    ended: float
    ok: bool
    stream: bool
    error: str = ""


class Clients:
    """Eight loops calling the proxy with the OpenAI SDK, no retries; every request recorded."""

    def __init__(self, base_url: str, api_key: str, fleet: str) -> None:
        self.base_url, self.api_key, self.fleet = base_url, api_key, fleet
        self.records: list[Req] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(CLIENTS)
        ]

    def start(self) -> Clients:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def since(self, t0: float, t1: float) -> list[Req]:
        with self._lock:
            return [r for r in self.records if t0 <= r.started < t1]

    def _loop(self, index: int) -> None:
        client = OpenAI(
            base_url=self.base_url,
            api_key=self.api_key,
            default_headers={"X-Haru-Fleet": self.fleet},
            max_retries=0,
            timeout=60,
        )
        stream = index % 2 == 0
        n = 0
        while not self._stop.is_set():
            model = MODELS[n % len(MODELS)]
            n += 1
            started = time.time()
            ok, error = True, ""
            try:
                messages = [{"role": "user", "content": f"client {index} request {n}"}]
                if stream:
                    chunks = client.chat.completions.create(
                        model=model, messages=messages, max_tokens=16, stream=True
                    )
                    for _ in chunks:
                        pass
                else:
                    client.chat.completions.create(model=model, messages=messages, max_tokens=16)
            except APIStatusError as exc:
                code = exc.body.get("code") if isinstance(exc.body, dict) else None
                ok, error = False, f"{exc.status_code} {code or type(exc).__name__}"
            except Exception as exc:  # noqa: BLE001 - every failure is a data point
                ok, error = False, type(exc).__name__
            with self._lock:
                self.records.append(Req(started, time.time(), ok, stream, error))
            if not ok:
                time.sleep(0.01)  # a client without retries moves on at once, not in a hot loop


class JitterRelay:
    """A TCP relay in front of a supervisor that delays every answer by up to `max_ms`."""

    def __init__(self, target_port: int, max_ms: int, seed: int) -> None:
        self.target_port, self.max_ms = target_port, max_ms
        self.port = free_port()
        self._rng = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> JitterRelay:
        self._thread.start()
        wait_for(lambda: not port_free(self.port), 10, "jitter relay")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port)
        )
        with contextlib.suppress(Exception):
            self._loop.run_until_complete(server.serve_forever())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return

        async def pump(src, dst, delay: bool) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    if delay:
                        await asyncio.sleep(self._rng.uniform(0, self.max_ms) / 1000)
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.close()

        await asyncio.gather(pump(reader, up_w, False), pump(up_r, writer, True))


class Stack:
    """Two simulated hosts and `manage.py serve`, with an ORM view of the server's database."""

    def __init__(
        self,
        workdir: Path,
        *,
        relay_ms: int = 0,
        interval_ms: int = 1000,
        engine_args: tuple[str, ...] = (),
        engine: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.engine = engine  # the bindings' profile engine (None: none named, as before)
        self.hosts = {
            name: SimHost(
                name,
                workdir,
                wake_latency_ms=150,
                start_asleep=(name == "west"),
                engine_args=engine_args,
            )
            for name in ("east", "west")
        }
        self.relays: dict[str, JitterRelay] = {}
        self.relay_ms = relay_ms
        self.server = ServerProc(workdir, env={"HARU_RECONCILE_INTERVAL_MS": str(interval_ms)})

    def start(self, policy: dict[str, Any]) -> None:
        for host in self.hosts.values():
            host.start()
        put_in_standby_posture(self.hosts["west"])
        layout = fleet_layout(self.hosts["east"], self.hosts["west"], policy, engine=self.engine)
        if self.relay_ms:
            for d in layout["domains"]:
                host = self.hosts[d["slug"]]
                relay = JitterRelay(host.port, self.relay_ms, seed=host.port).start()
                self.relays[d["slug"]] = relay
                d["supervisorUrl"] = f"http://127.0.0.1:{relay.port}"
        path = self.workdir / "layout.json"
        path.write_text(json.dumps(layout))
        self.server.manage("migrate", "--noinput", "-v0")
        self.server.manage("seed_layout", "--config", str(path))
        self.server.start()
        os.environ["HARU_VAR_DIR"] = self.server.env["HARU_VAR_DIR"]
        os.environ["HARU_SUPERVISOR_TOKEN"] = TOKEN
        os.environ["DJANGO_SETTINGS_MODULE"] = "haru.settings"
        os.environ.pop("DATABASE_URL", None)
        os.environ.pop("REDIS_URL", None)
        import django  # noqa: PLC0415 - after the environment above names the server's store

        django.setup()

    def stop(self) -> None:
        self.server.kill(signal.SIGTERM)
        for host in self.hosts.values():
            host.crash()

    # -- reads (the server's own database) --------------------------------------------------

    def fleet(self):
        from fleets.models import Fleet  # noqa: PLC0415 - needs django.setup() above

        return Fleet.objects.get(slug="e2e")

    def roles(self) -> tuple[str, str]:
        from fleets.models import Domain  # noqa: PLC0415 - needs django.setup() (the app registry) first

        fleet = self.fleet()
        by_id = {d.id: d.slug for d in Domain.objects.filter(fleet=fleet)}
        active = by_id[fleet.active_domain_id]
        return active, next(s for s in by_id.values() if s != active)

    def set_policy(self, **keys: Any) -> None:
        from fleets.models import Fleet  # noqa: PLC0415 - needs django.setup() (the app registry) first

        fleet = self.fleet()
        # Not a state field: the policy is operator configuration, re-read by every tick.
        Fleet.objects.filter(pk=fleet.pk).update(policy={**fleet.policy, **keys})

    def calm(self) -> bool:
        from fleets.models import Domain, Operation  # noqa: PLC0415 - needs django.setup() (the app registry) first

        fleet = self.fleet()
        if Operation.objects.filter(fleet=fleet, state__in=["pending", "running"]).exists():
            return False
        domains = list(Domain.objects.filter(fleet=fleet))
        standby = [d for d in domains if d.id != fleet.active_domain_id]
        return all(d.state == "ready" for d in domains) and all(
            d.slots.filter(kind="inference", state="sleeping").exists() for d in standby
        )

    def api(self, method: str, path: str, body: dict | None = None) -> httpx.Response:
        return self.server.api(method, path, body)


def op_figures(op, event_at: float) -> dict[str, float]:
    """Detection, recorded outage and step times of one promotion, in milliseconds."""
    from fleets.models import Event  # noqa: PLC0415 - needs django.setup() (the app registry) first

    done = {
        e.step: e
        for e in Event.objects.filter(operation=op, kind="operation.step.done").order_by("id")
    }
    out = {f"{s} ms": float(done[s].duration_ms or 0) for s in ("wake", "probe", "switch_route")}
    out["detection ms"] = (op.created_at.timestamp() - event_at) * 1000
    failover = done["switch_route"].data.get("failoverMs")
    if failover is not None:
        out["recorded outage ms"] = float(failover)
    out["commit"] = done["switch_route"].created_at.timestamp()
    return out


def run_round(stack: Stack, clients: Clients, kind: str, args) -> dict[str, Any]:
    from fleets.models import Operation  # noqa: PLC0415 - needs django.setup() (the app registry) first

    wait_for(stack.calm, 120, "a calm fleet", every=0.2)
    time.sleep(0.5)
    active, standby = stack.roles()
    host = stack.hosts[active]
    before = set(Operation.objects.values_list("id", flat=True))
    event_at = time.time()
    if kind == "crash":
        host.crash()
        event_at = time.time()  # every process of the host is gone from here on
    elif kind == "planned":
        answer = stack.api("POST", "/fleets/e2e/promote", {"targetDomainId": standby})
        answer.raise_for_status()
    else:
        assert host.proc is not None
        os.kill(host.proc.pid, signal.SIGKILL)  # the supervisor only: its engines stay up
    op = None
    if kind in ("crash", "planned", "supervisor"):
        limit = 30 if kind != "supervisor" else args.supervisor_down_s
        deadline = time.time() + limit
        while time.time() < deadline and op is None:
            op = (
                Operation.objects.exclude(id__in=before)
                .filter(kind="promote", routing_committed=True)
                .first()
            )
            time.sleep(0.05)
        if op is not None:
            wait_for(
                lambda: Operation.objects.filter(
                    pk=op.pk, state__in=["succeeded", "failed"]
                ).exists(),
                60,
                "the promotion to finish",
            )
    figures = op_figures(op, event_at) if op is not None else {}
    if kind.startswith("supervisor"):
        # Traffic through a supervisor-less active for the whole window, then it returns.
        remaining = event_at + args.supervisor_down_s - time.time()
        if remaining > 0:
            time.sleep(remaining)
    else:
        time.sleep(args.tail_s)
    window_end = time.time()
    # Restore the two-role posture for the next round.
    if kind == "crash":
        host.restart()
        wait_for(
            lambda: stack.calm() or _demote_if_awake(stack, active), 120, "the crashed host back"
        )
    elif kind.startswith("supervisor"):
        host.start()
        if op is not None:
            wait_for(lambda: stack.calm() or _demote_if_awake(stack, active), 120, "posture")
    commit = figures.pop("commit", None)
    reqs = clients.since(event_at - args.tail_s, window_end)
    after = [r for r in reqs if r.started >= event_at]
    held = [r.ended - r.started for r in after if commit is not None and r.started < commit]
    # What a client saw: failed answers until the last one, or the longest wait of a request
    # started before the routing commit (held at the proxy), the longer of the two. A request
    # already under way at the event waits from the event on.
    last_failed = max((r.ended - event_at for r in after if not r.ok), default=0.0)
    waited = [
        r.ended - max(r.started, event_at)
        for r in reqs
        if commit is not None and r.started < commit and r.ended > event_at
    ]
    row: dict[str, Any] = {
        "total": len(reqs),
        "failed": sum(not r.ok for r in reqs),
        "total_after": len(after),
        "failed_after": sum(not r.ok for r in after),
        "outage ms": max(last_failed, max(waited, default=0.0)) * 1000,
        "hold ms": held,
        "errors": sorted({r.error for r in reqs if not r.ok}),
        "errors_after": sorted(r.error for r in after if not r.ok),
        **figures,
    }
    if kind != "crash":
        # A planned promotion's "event" is the operator's request, and a supervisor-less
        # active is failed over by the degraded grace (policy), not detected: no overhead.
        if kind == "planned":
            row.pop("detection ms", None)
    elif "detection ms" in row and "wake ms" in row:
        row["overhead ms"] = (
            row["outage ms"] - row["detection ms"] - row["wake ms"] - row["probe ms"]
        )
    return row


def _demote_if_awake(stack: Stack, slug: str) -> bool:
    """Ask for the demotion of a returned old active once it is seen again (idempotent)."""
    from fleets.models import Domain, Operation  # noqa: PLC0415 - needs django.setup() (the app registry) first

    fleet = stack.fleet()
    if Operation.objects.filter(fleet=fleet, state__in=["pending", "running"]).exists():
        return False
    d = Domain.objects.get(fleet=fleet, slug=slug)
    if d.id != fleet.active_domain_id and d.state == "ready":
        stack.api("POST", "/fleets/e2e/demote", {"targetDomainId": slug})
    return False


def report(kind: str, rows: list[dict[str, Any]]) -> None:
    total = sum(r["total"] for r in rows)
    failed = sum(r["failed"] for r in rows)
    after = sum(r["total_after"] for r in rows)
    failed_after = sum(r["failed_after"] for r in rows)
    print(f"\n== {kind}: {len(rows)} round(s)")
    print(f"  failed/total               {failed}/{total}  (started after the event: "
          f"{failed_after}/{after})")  # fmt: skip
    outage = [r["outage ms"] for r in rows]
    print(
        f"  client-visible outage ms   p50 {pct(outage, 0.5):8.1f}   p95 {pct(outage, 0.95):8.1f}"
    )
    held = [h * 1000 for r in rows for h in r["hold ms"]]
    if held:
        print(f"  hold (wait) ms             p50 {pct(held, 0.5):8.1f}   p95 {pct(held, 0.95):8.1f}"
              f"   ({len(held)} requests before the commit)")  # fmt: skip
    for key in ("detection ms", "recorded outage ms", "wake ms", "probe ms", "switch_route ms",
                "overhead ms"):  # fmt: skip
        values = [r[key] for r in rows if key in r]
        if values:
            print(f"  {key:<26} p50 {pct(values, 0.5):8.1f}   p95 {pct(values, 0.95):8.1f}")
    errors = sorted({e for r in rows for e in r["errors"]})
    if errors:
        print(f"  error kinds                {', '.join(errors)}")
    after_errors = [e for r in rows for e in r["errors_after"]]
    if after_errors:
        print(f"  failed after the event     {', '.join(after_errors)}")


def jitter_run(args, workdir: Path) -> int:
    stale_ms = args.stale_ms
    stack = Stack(workdir, relay_ms=stale_ms // 2)
    clients = None
    try:
        stack.start({**POLICY, "heartbeatStaleMs": stale_ms, "autoFailover": True})
        clients = Clients(f"{stack.server.url}/v1", stack.server.api_token, "e2e").start()
        started = time.time()
        end = started + args.jitter_minutes * 60
        while time.time() < end:
            time.sleep(5)
        from fleets.models import Operation  # noqa: PLC0415 - needs django.setup() (the app registry) first

        ops = Operation.objects.filter(kind="promote").count()
        reqs = clients.since(started, time.time())
        print(f"\n== jitter: {args.jitter_minutes} min, answers delayed up to {stale_ms // 2} ms "
              f"(heartbeatStaleMs {stale_ms})")  # fmt: skip
        print(f"  false failovers            {ops}   (target 0)")
        print(f"  failed/total               {sum(not r.ok for r in reqs)}/{len(reqs)}")
        return 0 if ops == 0 else 1
    finally:
        if clients is not None:
            clients.stop()
        stack.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, help="rounds per kind (default 3; --streams: 1)")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--quick", action="store_true", help="one short round of each (CI)")
    parser.add_argument("--tail-s", type=float, default=1.5, help="traffic kept after a commit")
    parser.add_argument("--supervisor-down-s", type=float, default=6.0)
    parser.add_argument("--jitter-minutes", type=float, default=0.0)
    parser.add_argument("--stale-ms", type=int, default=3000, help="heartbeatStaleMs (jitter)")
    parser.add_argument(
        "--streams", type=int, default=0, help="the stream-continuation run with N streams"
    )
    parser.add_argument("--tokens", type=int, default=300, help="tokens per stream (--streams)")
    parser.add_argument(
        "--token-delay-ms",
        type=int,
        default=100,
        help="--streams: the sim engines' delay between tokens (10 per second per stream)",
    )
    parser.add_argument(
        "--client-processes",
        type=int,
        default=4,
        help="--streams: the client processes the streams are spread over",
    )
    parser.add_argument(
        "--json", action="store_true", help="--streams: the last line is the figures as JSON"
    )
    args = parser.parse_args()
    if args.n is None and not args.streams:
        args.n = 3
    if args.quick:
        args.n, args.tail_s, args.supervisor_down_s = 1, 0.5, 3.0
    # The stack's own embedded store (the server and this process read the same file), whatever
    # the calling environment points at; and the in-process reconcile loop, not Celery.
    for key in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(key, None)
    # The SDK logs every request at INFO through httpx: thousands of lines per round.
    for name in ("httpx", "httpx2", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)
    workdir = Path(tempfile.mkdtemp(prefix="haru-bench-failover-load-"))
    if args.streams:
        from bench import failover_streams  # noqa: PLC0415 - it imports this module's stack

        args.n = 1 if args.quick or args.n is None else args.n
        return failover_streams.run(args, workdir)
    if args.jitter_minutes:
        return jitter_run(args, workdir)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"unknown kind(s): {', '.join(sorted(unknown))}")
    stack = Stack(workdir)
    clients = None
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        stack.start({**POLICY, "autoFailover": True})
        clients = Clients(f"{stack.server.url}/v1", stack.server.api_token, "e2e").start()
        time.sleep(1.0)  # warm: every client has a connection and a snapshot
        for kind in kinds:
            stack.set_policy(autoFailover=kind != "supervisor-off")
            for i in range(args.n):
                row = run_round(stack, clients, kind, args)
                results.setdefault(kind, []).append(row)
                print(f"{kind} round {i + 1}/{args.n}: failed {row['failed']}/{row['total']}, "
                      f"outage {row['outage ms']:.0f} ms", flush=True)  # fmt: skip
    finally:
        if clients is not None:
            clients.stop()
        stack.stop()
    print(f"\n{CLIENTS} clients (half streaming), OpenAI SDK, max_retries=0")
    for kind, rows in results.items():
        report(kind, rows)
    print(f"\nstack kept in {workdir} (server log: {stack.server.log_path})")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
