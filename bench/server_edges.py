"""What the server's edge limits cost the chat path: server CPU time per request, compared.

    .venv/bin/python bench/server_edges.py [--seconds 3] [--rounds 3] [--concurrency 1,16]
                                           [--json]

Two servers run the same app (haru.asgi) against the same fast upstream (bench/proxy.py's raw
responder) and the same temporary SQLite state store, one worker each:
- `stock`: `python -m uvicorn --http httptools` with the options `manage.py serve` passes, and
  none of Haru's edge limits: the server as it was before them.
- `serve`: `manage.py serve`, the served path, whatever protocol it runs (today Haru's
  HTTP protocol with header and body deadlines, header size and count limits, an idle
  keep-alive limit and a connection cap: fleets/server/).
For each round, server, kind (non-streaming, streaming) and concurrency, the load generator of
bench/proxy.py sends keep-alive requests for the given seconds after a warm-up, and the server
process's CPU time (user + system, from /proc) is read before and after. The figure is CPU
microseconds per request, the median over rounds; the ratio `serve / stock` is what the edge
limits cost (1.00 = nothing). Rounds alternate the servers, so a busy machine slows both alike.
CPU time, unlike requests per second, does not depend much on what else the machine runs,
but two cores shared with other work still move it by 10-20 % from run to run.

`--protocol-only` isolates the edge itself: in this process, with no sockets, the same
keep-alive requests are fed to uvicorn's HttpToolsProtocol and to Haru's HaruHttpProtocol
serving a trivial app, alternately, and the CPU time per request (time.process_time) of each is
printed with the difference. This is the figure with little noise: what the deadlines, counts
and the idle registry add to one request. Linux only (/proc) for the server mode.
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

from bench import proxy as bp  # noqa: E402 - after the path set-up, run as a script

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
_REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer x\r\n"
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
    protocol.connection_made(_Transport())
    started = time.process_time()
    for _ in range(requests):
        protocol.data_received(_REQUEST)
        while not protocol.cycle.response_complete:
            await asyncio.sleep(0)
    used = time.process_time() - started
    protocol.connection_lost(None)
    return used / requests * 1e6


def protocol_only(args) -> int:
    import uvicorn  # noqa: PLC0415 - only this mode needs them in-process
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # noqa: PLC0415 - needs django.setup() (the app registry) first
    from uvicorn.server import ServerState  # noqa: PLC0415 - needs django.setup() (the app registry) first

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "haru.settings")
    os.environ.setdefault("HARU_VAR_DIR", tempfile.mkdtemp(prefix="haru-bench-edges-"))
    from fleets.server.protocol import HaruHttpProtocol  # noqa: PLC0415 - needs the settings

    classes = {"stock": HttpToolsProtocol, "haru": HaruHttpProtocol}
    figures: dict[str, list[float]] = {name: [] for name in classes}
    requests = args.requests
    for round_no in range(args.rounds):
        for name, cls in classes.items():
            config = uvicorn.Config(_trivial_app, http=cls, lifespan="off", log_level="warning")
            config.load()
            us = asyncio.run(_drive(cls, config, ServerState(), requests))
            figures[name].append(us)
            print(f"round {round_no + 1} {name:<5} {us:6.2f} us CPU per request", flush=True)
    stock, haru = (statistics.median(figures[n]) for n in ("stock", "haru"))
    print(
        f"summary: protocol CPU per request (median of {args.rounds} rounds of {requests}): "
        f"stock {stock:.2f} us, haru {haru:.2f} us, difference {haru - stock:+.2f} us "
        f"({haru / stock:.3f}x)"
    )
    if args.json:
        print(json.dumps({"stock_us": stock, "haru_us": haru}))
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
        help="measure the two HTTP protocol classes in-process, no sockets (low noise)",
    )
    parser.add_argument("--requests", type=int, default=20000, help="per round, --protocol-only")
    args = parser.parse_args()
    if args.protocol_only:
        return protocol_only(args)
    try:
        import uvloop  # noqa: PLC0415 - optional: the load generator runs without it, slower

        uvloop.install()
    except ImportError:
        pass
    procs = bp.Processes()
    try:
        with tempfile.TemporaryDirectory(prefix="haru-bench-edges-") as var_dir:
            upstream_port = bp._free_port()
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
            ports = {name: bp._free_port() for name in args.servers}
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
