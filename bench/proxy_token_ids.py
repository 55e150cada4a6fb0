"""The token-id case of bench/proxy.py: what keeping each stream's token ids costs the proxy.

    .venv/bin/python bench/proxy.py --token-ids [--before REF_OR_DIR] [--cpu-rounds 10]
                                    [--seconds 2] [--cpu-concurrency 8] [--json]

Long streaming chat requests (bench/proxy.py's `LONG_TOKENS` tokens, a chunk each) against the
raw upstream, bound as a vLLM model server. This checkout's proxy asks the upstream for the
token ids it keeps to continue a cut stream (`return_token_ids`), reads them from every chunk
and strips them before forwarding; today's proxy, the code before stream continuation (a
checkout of `--before`, default the last commit before it), asks for nothing and passes the
same answer through. Both run as `manage.py serve` (the same venv, a fleet each on its own
SQLite store), against one raw upstream, measured alternately in short windows for
`--cpu-rounds` rounds so the shared machine's drift falls on both alike. It prints each one's
process CPU microseconds per request, and the per-round ratio with/without the ledger (median
and range). Target: at most 1.10x.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from bench import proxy
from common.ports import free_port

# The last commit before the proxy kept token ids: "today's code" of the target.
BEFORE = "58e2179"


def checkout(ref_or_dir: str) -> Path:
    """A directory holding `ref_or_dir`: itself if it is a checkout, else that commit's tree
    extracted with `git archive` (no worktree is registered)."""
    path = Path(ref_or_dir)
    if (path / "manage.py").is_file():
        return path.resolve()
    out = Path(tempfile.mkdtemp(prefix="haru-before-"))
    archive = subprocess.run(
        ["git", "-C", str(proxy.ROOT), "archive", ref_or_dir],
        capture_output=True,
        check=True,
        timeout=120,
    )
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True, timeout=120)
    return out


def _prepared(root: Path, upstream_port: int) -> dict[str, str]:
    """A var dir with a migrated store and the bench fleet, for checkout `root`."""
    var = tempfile.mkdtemp(prefix="haru-ids-")
    env = {**proxy._haru_env(var), "PYTHONPATH": str(root)}
    saved, proxy.ROOT = proxy.ROOT, root  # _seed runs `root`'s manage.py
    try:
        proxy._seed(env, var, {"long": upstream_port})
    finally:
        proxy.ROOT = saved
    return env


def _long_chat(port: int) -> bytes:
    body = {
        "model": proxy.MODELS["long"],
        "stream": True,
        "max_tokens": proxy.LONG_TOKENS,
        "messages": [{"role": "user", "content": "tell a long story"}],
    }
    auth = {"Authorization": f"Bearer {proxy.TOKEN}"}
    return proxy._request(port, "/v1/chat/completions", json.dumps(body).encode(), auth)


async def _stripped(port: int) -> bool:
    """Whether the answer through `port` is exactly the stream a client gets without ids."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_long_chat(port))
        head = await reader.readuntil(b"\r\n\r\n")
        body = b""
        while True:
            size = int((await reader.readline()).strip().split(b";")[0], 16)
            body += (await reader.readexactly(size + 2))[:-2]
            if size == 0:
                break
    finally:
        writer.close()
    # Byte for byte what the upstream writes when no ids are asked: what clients get today.
    return head.startswith(b"HTTP/1.1 200") and body == b"".join(proxy._LONG_SSE[False])


async def _alternate(servers: dict[str, tuple[int, int]], args) -> dict:
    for port, pid in servers.values():  # warm both up
        await proxy._measure(port, _long_chat(port), args.cpu_concurrency, 1, 0.5, pid)
    cpu: dict[str, list[float]] = {name: [] for name in servers}
    for round_ in range(args.cpu_rounds):
        names = list(servers) if round_ % 2 == 0 else list(reversed(servers))
        for name in names:
            port, pid = servers[name]
            measured = await proxy._measure(
                port, _long_chat(port), args.cpu_concurrency, args.seconds, 0.3, pid
            )
            cpu[name].append(measured["cpu_us"])
        print(
            f"  round {round_ + 1}: with the ledger {cpu['ledger'][-1]:.0f} us, today's "
            f"{cpu['today'][-1]:.0f} us per request ({cpu['ledger'][-1] / cpu['today'][-1]:.3f}x)",
            flush=True,
        )
    ratios = [a / b for a, b in zip(cpu["ledger"], cpu["today"], strict=True)]
    return {
        "tokens": proxy.LONG_TOKENS,
        "c": args.cpu_concurrency,
        "rounds": args.cpu_rounds,
        "ledger_cpu_us": round(statistics.median(cpu["ledger"]), 1),
        "today_cpu_us": round(statistics.median(cpu["today"]), 1),
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_min": round(min(ratios), 3),
        "ratio_max": round(max(ratios), 3),
    }


def run(args) -> int:
    before = checkout(args.before)
    procs = proxy.Processes()
    try:
        upstream_port = free_port()
        upstream = procs.start(
            [proxy.PYTHON, str(proxy.__file__), "--serve-raw", str(upstream_port)]
        )
        proxy._wait_port(upstream_port, upstream, "the raw upstream")
        roots = {"ledger": proxy.ROOT, "today": before}
        servers = {}
        for name, root in roots.items():
            env = _prepared(root, upstream_port)
            port = free_port()
            argv = [proxy.PYTHON, str(root / "manage.py"), "serve", "--host", "127.0.0.1"]
            argv += ["--port", str(port), "--no-reconcile-loop"]
            server = procs.start(argv, env=env)
            proxy._wait_port(port, server, f"{name} ({root})")
            servers[name] = (port, server.pid)
        stripped = asyncio.run(_stripped(servers["ledger"][0]))
        figures = asyncio.run(_alternate(servers, args))
    finally:
        procs.stop_all()
        if before != Path(args.before).resolve():
            shutil.rmtree(before, ignore_errors=True)  # the tree extracted above
    figures["ledger_answer_is_todays"] = stripped
    print(f"with the ledger: {proxy.ROOT}\ntoday's: {before} ({args.before})")
    print(
        f"  CPU per request, long streaming chat ({figures['tokens']} tokens), "
        f"c={figures['c']}, median of {figures['rounds']} rounds: with the ledger "
        f"{figures['ledger_cpu_us']:.0f} us, today's {figures['today_cpu_us']:.0f} us, ratio "
        f"{figures['ratio_median']:.3f}x (target <= 1.10x; range {figures['ratio_min']:.3f}x "
        f"to {figures['ratio_max']:.3f}x)"
    )
    print(f"  the ledger's answer byte for byte today's: {'yes' if stripped else 'NO'}")
    if args.json:
        print(json.dumps({"token_ids": figures}))
    return 0 if stripped else 1
