"""Compare the chat proxy's cost per request of this checkout with another one, in one run.

    .venv/bin/python bench/proxy_ab.py OTHER_CHECKOUT [--rounds 10] [--seconds 2]
                                       [--concurrency 8] [--calls 500] [--json]

For a change that should not move the proxy's cost (a reshaping, a refactor), `bench/proxy.py`
run once per checkout is too coarse: on a shared machine two back-to-back runs of the same
commit can differ by a third. This bench starts both checkouts' `manage.py serve` (the same
venv, a fleet each on its own SQLite store, one raw upstream shared by both: bench/proxy.py's)
and measures them alternately, in short windows, for `--rounds` rounds and both request kinds
(non-streaming and streaming), so that the machine's drift falls on both alike. It prints each
checkout's process CPU microseconds per request and the per-round ratio this/other (median and
range). OTHER_CHECKOUT is a directory holding another commit, e.g. made with
`git worktree add /tmp/before <commit>`.

`--calls N` adds a figure no drift can move: Python function calls per request, counted by
cProfile in each checkout's server over N requests (one connection, one at a time; the calls of
start-up and shut-down are removed by a second run of N/5 requests). 0 skips it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import proxy  # noqa: E402
from common.ports import free_port  # noqa: E402

KINDS = ("non-streaming", "streaming")


def _body(kind: str) -> bytes:
    messages = [{"role": "user", "content": "ping"}]
    body = {"model": proxy.MODELS["raw"], "stream": kind == "streaming", "messages": messages}
    return json.dumps(body).encode()


def _chat(port: int, kind: str) -> bytes:
    auth = {"Authorization": f"Bearer {proxy.TOKEN}"}
    return proxy._request(port, "/v1/chat/completions", _body(kind), auth)


def _prepared(root: Path, upstream_port: int) -> dict[str, str]:
    """A var dir with a migrated store and the bench fleet, for checkout `root`."""
    var = tempfile.mkdtemp(prefix="haru-ab-")
    env = {**proxy._haru_env(var), "PYTHONPATH": str(root)}
    saved, proxy.ROOT = proxy.ROOT, root  # _seed runs `root`'s manage.py
    try:
        proxy._seed(env, var, {"raw": upstream_port})
    finally:
        proxy.ROOT = saved
    return env


def _serve_argv(root: Path, port: int) -> list[str]:
    return [
        proxy.PYTHON, str(root / "manage.py"), "serve", "--host", "127.0.0.1",
        "--port", str(port), "--no-reconcile-loop",
    ]  # fmt: skip


async def _alternate(servers: dict[str, tuple[int, int]], args) -> dict:
    for port, pid in servers.values():  # warm both up
        await proxy._measure(port, _chat(port, "non-streaming"), args.concurrency, 1, 0.5, pid)
    figures: dict = {}
    for kind in KINDS:
        cpu: dict[str, list[float]] = {name: [] for name in servers}
        for round_ in range(args.rounds):
            names = list(servers) if round_ % 2 == 0 else list(reversed(servers))
            for name in names:
                port, pid = servers[name]
                measured = await proxy._measure(
                    port, _chat(port, kind), args.concurrency, args.seconds, 0.3, pid
                )
                cpu[name].append(measured["cpu_us"])
        ratios = [this / other for this, other in zip(cpu["this"], cpu["other"], strict=True)]
        figures[kind] = {
            "this_cpu_us": round(statistics.median(cpu["this"]), 1),
            "other_cpu_us": round(statistics.median(cpu["other"]), 1),
            "ratio_median": round(statistics.median(ratios), 3),
            "ratio_min": round(min(ratios), 3),
            "ratio_max": round(max(ratios), 3),
            "rounds": args.rounds,
        }
    return figures


def _profiled_calls(root: Path, env: dict[str, str], requests: int) -> int:
    """All Python function calls in `root`'s server while it answers `requests` chats."""
    port = free_port()
    out = Path(env["HARU_VAR_DIR"]) / f"calls-{requests}.prof"
    argv = _serve_argv(root, port)
    argv[1:2] = ["-m", "cProfile", "-o", str(out), argv[1]]
    server = subprocess.Popen(
        argv, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        proxy._wait_port(port, server, f"{root} under cProfile")

        async def one_at_a_time() -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            payload = _chat(port, "non-streaming")
            for _ in range(requests):
                writer.write(payload)
                if await proxy._read_response(reader) != 200:
                    raise RuntimeError(f"{root}: a chat request failed")
            writer.close()

        asyncio.run(one_at_a_time())
    finally:
        server.send_signal(signal.SIGINT)  # uvicorn exits cleanly; cProfile writes its file
        server.wait(60)
    return sum(row[1] for row in pstats.Stats(str(out)).stats.values())  # type: ignore[attr-defined]


def _calls_per_request(root: Path, env: dict[str, str], requests: int) -> float:
    few = max(1, requests // 5)
    return (_profiled_calls(root, env, requests) - _profiled_calls(root, env, few)) / (
        requests - few
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other", type=Path, help="the other checkout (a directory)")
    parser.add_argument("--rounds", type=int, default=10, help="alternations per request kind")
    parser.add_argument("--seconds", type=float, default=2.0, help="measured seconds per window")
    parser.add_argument("--concurrency", type=int, default=8, help="client connections")
    parser.add_argument("--calls", type=int, default=500, help="requests profiled; 0 skips")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON at the end")
    args = parser.parse_args()
    other = args.other.resolve()
    if not (other / "manage.py").is_file():
        parser.error(f"{other} holds no manage.py: name a checkout of Haru")
    if args.rounds < 1 or args.seconds <= 0 or args.concurrency < 1 or args.calls < 0:
        parser.error("--rounds and --concurrency must be at least 1, --seconds above 0")
    if 0 < args.calls < 10:
        parser.error("--calls must be 0 (skip) or at least 10")

    procs = proxy.Processes()
    try:
        upstream_port = free_port()
        upstream = procs.start(
            [proxy.PYTHON, str(ROOT / "bench" / "proxy.py"), "--serve-raw", str(upstream_port)]
        )
        proxy._wait_port(upstream_port, upstream, "the raw upstream")
        roots = {"this": ROOT, "other": other}
        envs = {name: _prepared(root, upstream_port) for name, root in roots.items()}
        servers, started = {}, []
        for name, root in roots.items():
            port = free_port()
            server = procs.start(_serve_argv(root, port), env=envs[name])
            proxy._wait_port(port, server, f"{name} ({root})")
            servers[name] = (port, server.pid)
            started.append(server)
        figures = asyncio.run(_alternate(servers, args))
        for server in started:  # before the profiled runs, which start their own
            procs.stop(server)
        if args.calls:
            figures["calls_per_request"] = {
                name: round(_calls_per_request(root, envs[name], args.calls), 1)
                for name, root in roots.items()
            }
    finally:
        procs.stop_all()

    print(f"this: {ROOT}\nother: {other}")
    for kind in KINDS:
        row = figures[kind]
        print(
            f"{kind}: this {row['this_cpu_us']} us, other {row['other_cpu_us']} us per request; "
            f"this/other per round: median {row['ratio_median']}x "
            f"(range {row['ratio_min']}x to {row['ratio_max']}x, {row['rounds']} rounds)"
        )
    if "calls_per_request" in figures:
        calls = figures["calls_per_request"]
        print(f"Python calls per request: this {calls['this']}, other {calls['other']}")
    if args.json:
        print(json.dumps({"this": str(ROOT), "other": str(other), **figures}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
