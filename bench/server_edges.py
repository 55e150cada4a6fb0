"""What the HTTP edge limits cost, and what they hold against (issue 11, finding 1).

    .venv/bin/python bench/server_edges.py --protocol-only [--rounds 3] [--requests 20000]
    .venv/bin/python bench/server_edges.py [--seconds 3] [--rounds 3] [--concurrency 1,16]
    .venv/bin/python bench/server_edges.py --finding-1 [--idle 3000] [--json]

`--protocol-only` isolates the edge itself, and is the figure for what the limits cost: in
this process, with no sockets, the same keep-alive requests (a POST with a small body, to a
path no protocol treats specially) are fed to uvicorn's HttpToolsProtocol, to the shared edge
as the supervisor serves it (common/edge/protocol.py, default HARU_SUPERVISOR_HTTP_*
limits) and to the control plane's HaruHttpProtocol (fleets/server/protocol.py, which adds the
chat path's one check per request), each serving a trivial app, alternately; the CPU time per
request (time.process_time) of each is printed with the differences from stock. This is the
figure with little noise: what the deadlines, counts and the idle registry add to one request.

The server mode compares whole servers: `stock` (`python -m uvicorn --http httptools` with the
options `manage.py serve` passes and none of Haru's edge) and `serve` (`manage.py serve`, the
served path) run the same app (haru.asgi) against the same fast upstream (bench/proxy.py's raw
responder) and the same temporary SQLite state store, one worker each. For each round, server,
kind (non-streaming, streaming) and concurrency, the load generator of bench/proxy.py sends
keep-alive chat requests for the given seconds after a warm-up, and the server process's CPU
time (user + system, from /proc) is read before and after; the figure is CPU microseconds per
request, the median over rounds. The ratio `serve / stock` is not the limits' cost: `serve`
answers chat on its direct path (fleets/server/direct.py), with no ASGI messages, which saves
far more than the limits cost, so the ratio mixes the two (below 1.00 since the direct path
landed); bench/proxy.py's CPU comparison is the chat path's own figure. Rounds alternate the
servers, so a busy machine slows both alike; two cores shared with other work still move CPU
time by 10-20 % from run to run. Linux only (/proc).

`--finding-1` re-runs finding 1's attacks, unauthenticated, against a `manage.py serve` and a
`python -m supervisor` (simulated GPU), each with its default limits, and prints for each:
how many of `--idle` idle connections it still holds (against its connection cap) and whether
/healthz (and, with the token, the API behind it: /v1/fleets/... or /v1/status) still answers
while they are held; its peak resident memory while 4 clients each send 50 MB of headers, and
their answers; and the seconds until a slowloris connection (a header byte every 0.2 s) is
closed. On stock uvicorn the issue found 20,000 idle connections exhausting the descriptors
(/healthz reset), 420 MB more memory for 4 x 50 MB of headers (answered 200), and slowloris
kept for ever.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import django  # noqa: E402 - after the path set-up, run as a script
import uvicorn  # noqa: E402
from uvicorn.server import ServerState  # noqa: E402

from bench import proxy as bp  # noqa: E402
from common.edge.protocol import protocol_with  # noqa: E402
from common.private_apis import HttpToolsProtocol  # noqa: E402
from supervisor.settings import edge_limits_from_env  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of `pid`, in seconds (fields 14 and 15 of /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def start_server(procs: bp.Processes, env: dict[str, str], port: int, name: str):
    if name == "stock":
        argv = [bp.PYTHON, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--http", "httptools", "--log-level", "warning", "--no-access-log"]
        argv += ["--lifespan", "off", "--no-proxy-headers", "haru.asgi:application"]
        env = {**env, "HARU_RECONCILE_INTERVAL_MS": ""}
    else:
        argv = [bp.PYTHON, str(ROOT / "manage.py"), "serve", "--host", "127.0.0.1"]
        argv += ["--port", str(port), "--no-reconcile-loop"]
    proc = procs.start(argv, env=env)
    bp._wait_port(port, proc, name)
    return proc


async def measure(pid: int, port: int, payload: bytes, c: int, seconds: float, warmup: float):
    await bp._measure(port, payload, c, warmup, 0)  # warm-up, not counted
    before = cpu_seconds(pid)
    figures = await bp._measure(port, payload, c, seconds, 0)
    used = cpu_seconds(pid) - before
    return {"requests": figures["n"], "cpu_s": used, "us_per_request": used / figures["n"] * 1e6}


async def run(args, ports: dict[str, int], pids: dict[str, int], upstream_port: int):
    # The request bytes each server gets, by kind: the same body, only the Host port differs.
    payloads = {
        name: {kind: via for kind, _direct, via in bp._scenarios(model, upstream_port, port)}
        for name, port in ports.items()
        for model in [bp.MODELS["raw"]]
    }
    rows: dict[tuple[str, str, int], list[float]] = {}
    for round_no in range(args.rounds):
        for kind in ("non-streaming", "streaming"):
            for c in args.concurrency:
                for name in args.servers:
                    payload = payloads[name][kind]
                    got = await measure(pids[name], ports[name], payload, c, args.seconds, 0.3)
                    rows.setdefault((kind, name, c), []).append(got["us_per_request"])
                    print(
                        f"round {round_no + 1} {name:<6} {kind:<14} c={c:<3} "
                        f"{got['requests']:6d} requests {got['cpu_s']:6.2f} CPU s "
                        f"{got['us_per_request']:7.1f} us/request",
                        flush=True,
                    )
    return rows


# ---------------------------------------------------------------------------------------------
# --protocol-only: the protocol classes alone, fed in-process.

_BODY = b'{"model": "bench-raw", "messages": [{"role": "user", "content": "ping"}]}'
# Not a chat path: the control plane's protocol would answer that on its direct path (a real
# proxy flow), and this mode compares the edges serving the same app.
_REQUEST = (
    b"POST /bench/edge HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer x\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(_BODY), _BODY)
)


async def _trivial_app(scope, receive, send):
    await receive()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"{}"})


class _Transport:
    """Enough of an asyncio transport for uvicorn's protocol: writes are counted, not sent."""

    def __init__(self) -> None:
        self.closing = False
        self.written = 0

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8700)}.get(
            name, default
        )

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_protocol(self, protocol) -> None:
        pass


async def _drive(cls, config, state, requests: int) -> float:
    loop = asyncio.get_running_loop()
    protocol = cls(config=config, server_state=state, app_state={}, _loop=loop)
    transport = _Transport()
    protocol.connection_made(transport)
    started = time.process_time()
    for _ in range(requests):
        protocol.data_received(_REQUEST)
        while not protocol.cycle.response_complete:
            await asyncio.sleep(0)
    used = time.process_time() - started
    if transport.closing:
        raise RuntimeError(f"{cls.__name__} closed the connection: the requests were refused")
    protocol.connection_lost(None)
    return used / requests * 1e6


def protocol_only(args) -> int:

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "haru.settings")
    os.environ.setdefault("HARU_VAR_DIR", tempfile.mkdtemp(prefix="haru-bench-edges-"))
    django.setup()  # HaruHttpProtocol looks up the chat path's targets on every request
    from fleets.server.protocol import HaruHttpProtocol  # noqa: PLC0415 - needs the settings

    supervisor_edge = protocol_with(
        edge_limits_from_env({}), body_setting="HARU_SUPERVISOR_HTTP_MAX_BODY_BYTES"
    )
    classes = {"stock": HttpToolsProtocol, "supervisor": supervisor_edge, "haru": HaruHttpProtocol}
    figures: dict[str, list[float]] = {name: [] for name in classes}
    requests = args.requests
    for cls in classes.values():
        # Not counted: the first request imports the chat path's module (HaruHttpProtocol).
        config = uvicorn.Config(_trivial_app, http=cls, lifespan="off", log_level="warning")
        config.load()
        asyncio.run(_drive(cls, config, ServerState(), 200))
    for round_no in range(args.rounds):
        for name, cls in classes.items():
            config = uvicorn.Config(_trivial_app, http=cls, lifespan="off", log_level="warning")
            config.load()
            us = asyncio.run(_drive(cls, config, ServerState(), requests))
            figures[name].append(us)
            print(f"round {round_no + 1} {name:<10} {us:6.2f} us CPU per request", flush=True)
    medians = {name: statistics.median(values) for name, values in figures.items()}
    stock = medians["stock"]
    print(
        f"summary: protocol CPU per request (median of {args.rounds} rounds of {requests}): "
        f"stock {stock:.2f} us, "
        + ", ".join(
            f"{name} {us:.2f} us ({us - stock:+.2f} us, {us / stock:.3f}x)"
            for name, us in medians.items()
            if name != "stock"
        )
    )
    if args.json:
        print(json.dumps({f"{name}_us": us for name, us in medians.items()}))
    return 0


# ---------------------------------------------------------------------------------------------
# --finding-1: the attacks, re-run against both servers as they are deployed.


def _start_supervisor(procs: bp.Processes, work: Path) -> tuple[int, int]:
    port = bp.free_port()
    config = {
        "gpu": {"backend": "sim", "simStateFile": str(work / "gpu.json")},
        "stateDir": str(work / "supervisor-state"),
        "slots": [{"kind": "inference", "gpuIndex": 0, "models": [{"name": "m", "port": 9}]}],
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARU_")}
    env.update(
        PORT=str(port),
        PYTHONPATH=str(ROOT),
        HARU_SUPERVISOR_CONFIG=json.dumps(config),
        HARU_SUPERVISOR_TOKEN=SUPERVISOR_TOKEN,
    )
    proc = procs.start([bp.PYTHON, "-m", "supervisor"], env=env)
    bp._wait_port(port, proc, "supervisor")
    return proc.pid, port


SUPERVISOR_TOKEN = "bench-supervisor-token-0123456789"


def _get(url: str, token: str | None) -> tuple[int | None, float]:
    import httpx  # noqa: PLC0415 - only this mode calls it

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    started = time.monotonic()
    try:
        status: int | None = httpx.get(url, headers=headers, timeout=10).status_code
    except httpx.HTTPError:
        status = None
    return status, time.monotonic() - started


def attack(name: str, pid: int, port: int, api: tuple[str, str], idle_count: int) -> dict:
    from bench import hostile_clients as hostile  # noqa: PLC0415 - only this mode needs them

    address = ("127.0.0.1", port)
    url = f"http://127.0.0.1:{port}"
    figures: dict = {"server": name}
    # Idle connections past the cap: how many the server still holds, and who still answers.
    hostile.raise_own_nofile(idle_count + 256)
    started = time.monotonic()
    idle = hostile.idle_flood(address, idle_count)
    flood_s = time.monotonic() - started
    try:
        # Accepted in order: once /healthz is answered, every idle connection was accepted
        # (and the oldest idle ones closed to make room).
        healthz, healthz_s = _get(f"{url}/healthz", None)
        sockets = hostile.open_sockets(pid)
        api_status, api_s = _get(f"{url}{api[0]}", api[1])
        held = hostile.still_open(idle)
    finally:
        for sock in idle:
            sock.close()
    figures["idle"] = {
        "opened": idle_count,
        "opened_in_s": round(flood_s, 2),
        "held": held,
        "server_sockets": sockets,
        "healthz": healthz,
        "healthz_s": round(healthz_s, 3),
        "api": api[0],
        "api_status": api_status,
        "api_s": round(api_s, 3),
    }
    print(
        f"{name}: {idle_count} idle connections opened in {flood_s:.1f} s, {held} still held "
        f"({sockets} sockets in the server); then /healthz {healthz} in {healthz_s:.3f} s, "
        f"{api[0]} {api_status} in {api_s:.3f} s",
        flush=True,
    )
    # 4 clients x 50 MB of headers: the server's peak memory while they send.
    with hostile.PeakRss(pid) as rss:
        statuses = hostile.header_flood(address, clients=4, mib=50)
    figures["headers"] = {
        "statuses": statuses,
        "rss_before_mib": round(rss.before_kib / 1024, 1),
        "peak_growth_mib": round(rss.grew_mib, 1),
    }
    print(
        f"{name}: 4 x 50 MB of headers answered {statuses}; resident memory "
        f"{rss.before_kib / 1024:.0f} MiB before, peak +{rss.grew_mib:.1f} MiB",
        flush=True,
    )
    # Slowloris: one header byte every 0.2 s.
    took = hostile.slowloris(address, give_up_s=120)
    figures["slowloris_closed_after_s"] = None if took is None else round(took, 2)
    print(
        f"{name}: slowloris closed after {took:.1f} s"
        if took is not None
        else f"{name}: slowloris still open after 120 s",
        flush=True,
    )
    return figures


def finding_1(args) -> int:
    procs = bp.Processes()
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="haru-bench-edges-") as var_dir:
            env = bp._haru_env(var_dir)
            bp._seed(env, var_dir, {"raw": bp.free_port()})  # /v1/fleets/bench reads it
            serve_port = bp.free_port()
            serve = start_server(procs, env, serve_port, "serve")
            supervisor_pid, supervisor_port = _start_supervisor(procs, Path(var_dir))
            print(f"serve on {serve_port}, supervisor on {supervisor_port}, default limits")
            results.append(
                attack("serve", serve.pid, serve_port, ("/v1/fleets/bench", bp.TOKEN), args.idle)
            )
            results.append(
                attack(
                    "supervisor",
                    supervisor_pid,
                    supervisor_port,
                    ("/v1/status", SUPERVISOR_TOKEN),
                    args.idle,
                )
            )
    finally:
        procs.stop_all()
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16]
    )
    parser.add_argument(
        "--servers", type=lambda s: s.split(","), default=["stock", "serve"], help=argparse.SUPPRESS
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON at the end")
    parser.add_argument(
        "--protocol-only",
        action="store_true",
        help="measure the three HTTP protocol classes in-process, no sockets (low noise)",
    )
    parser.add_argument("--requests", type=int, default=20000, help="per round, --protocol-only")
    parser.add_argument(
        "--finding-1",
        action="store_true",
        help="re-run finding 1's attacks against serve and a supervisor; print what they held",
    )
    parser.add_argument("--idle", type=int, default=3000, help="idle connections, --finding-1")
    args = parser.parse_args()
    if args.protocol_only:
        return protocol_only(args)
    if args.finding_1:
        return finding_1(args)
    try:
        import uvloop  # noqa: PLC0415 - optional: the load generator runs without it, slower

        uvloop.install()
    except ImportError:
        pass
    procs = bp.Processes()
    try:
        with tempfile.TemporaryDirectory(prefix="haru-bench-edges-") as var_dir:
            upstream_port = bp.free_port()
            upstream = procs.start(
                [bp.PYTHON, str(ROOT / "bench" / "proxy.py")]
                + [
                    "--serve-raw",
                    str(upstream_port),
                ]
            )
            bp._wait_port(upstream_port, upstream, "raw upstream")
            env = bp._haru_env(var_dir)
            bp._seed(env, var_dir, {"raw": upstream_port})
            ports = {name: bp.free_port() for name in args.servers}
            pids = {name: start_server(procs, env, ports[name], name).pid for name in args.servers}
            print(
                f"servers {ports}, one worker each, {args.rounds} rounds of {args.seconds:g} s, "
                f"{os.cpu_count()} CPUs",
                flush=True,
            )
            rows = asyncio.run(run(args, ports, pids, upstream_port))
    finally:
        procs.stop_all()
    print("summary: server CPU per chat request (median over rounds)")
    summary = []
    for kind in ("non-streaming", "streaming"):
        for c in args.concurrency:
            figures = {name: statistics.median(rows[(kind, name, c)]) for name in args.servers}
            line = f"  {kind:<14} c={c:<3} " + "  ".join(
                f"{name} {us:7.1f} us" for name, us in figures.items()
            )
            if {"stock", "serve"} <= figures.keys():
                line += f"  serve/stock {figures['serve'] / figures['stock']:.3f}"
            print(line)
            summary.append({"kind": kind, "c": c, "us_per_request": figures})
    if args.json:
        print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
