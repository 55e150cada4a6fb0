"""Benchmark the chat proxy: direct to a fast upstream vs through Haru, same worker count.

    .venv/bin/python bench/proxy.py [--seconds 3] [--concurrency 1,32] [--upstream raw,sim]
                                    [--client haru|httpx|aiohttp]
                                    [--compare-access-log] [--compare-django] [--json]

Upstreams (one uvicorn worker each, no delays):
- `raw`: a minimal raw ASGI responder: an OpenAI-shaped JSON body, or 8 SSE chunks when the
  request says `"stream": true`. The cheapest possible model server: the hardest comparison.
- `sim`: the simulated engine (`python -m supervisor.sim`) with zero delays: a Starlette app that
  parses and answers like vLLM (16 tokens; 18 SSE events when streaming).
Then Haru (`manage.py serve`, one worker, a temporary SQLite state store via HARU_VAR_DIR, a
fleet whose bindings point at the upstreams, HARU_API_TOKEN set so auth is on the measured
path). A raw asyncio load generator (keep-alive connections, pre-built request bytes, minimal
HTTP/1.1 parsing, uvloop) measures each scenario for the given seconds after a short warm-up
and prints requests per second, latency p50/p99, the throughput ratio and the added latency.
`--token-ids` instead measures what keeping token ids costs on long streams, against today's
code side by side (bench/proxy_token_ids.py).
All processes share the machine's CPUs (the load generator included), as they would on one
host.

Paths through Haru: `lean` is `manage.py serve` (haru.asgi, uvicorn with its access log on);
`--compare-access-log` adds `quiet` (the same app, uvicorn's access log off);
`--compare-django` adds `django` (the same proxy code behind Django's own ASGI handler and
middleware, bench/django_proxy.py: why haru/asgi.py routes the proxy ahead of Django).
`--client httpx|aiohttp` runs the `lean` and `quiet` paths with the proxy's upstream HTTP client
replaced by that library (bench/upstream_clients.py, the same uvicorn settings as `manage.py
serve`); `haru` (the default) is the hand-written client in fleets/proxy/upstream.py. Run it
once per client to re-measure that choice.
Every process started here runs in its own process group and is killed on exit.

CPU per request (`--cpu-concurrency`, default 8; 0 skips it): Haru's process CPU seconds (user +
system, from /proc) over the requests it served in the measured window, next to the same figure
for a bare asyncio relay (asyncio streams on the standard loop, no framework) that passes the
same requests to the same raw upstream; both in one run, so the ratio compares like with like.
Rounds (`--cpu-rounds`, default 5) measure the three back to back; the figures are medians.
Each round also loads Haru and the relay at the same time: a ratio the machine's drift between
two back-to-back runs cannot move, though both then share the CPUs (printed as "at once").
Where Haru's time goes and what was done about it: docs/proxy-hold.md, "CPU on the healthy
path" (py-spy on `manage.py serve` under this load).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import uvicorn  # noqa: E402

from common.ports import free_port  # noqa: E402
from haru.local.processes import stop  # noqa: E402

PYTHON = sys.executable
TOKEN = "bench-token-0123456789abcdefghijklmnop"

# The model name each upstream kind is bound under in the benchmark fleet. `long` is the raw
# upstream too, answering long streams (with token ids when asked): the token-id case.
MODELS = {"raw": "bench-raw", "sim": "bench-sim", "long": "bench-long"}
# The engine a binding names in its profile: the proxy keeps token ids only for engines that
# return them (vLLM), so the token-id case binds `long` as one.
ENGINES = {"long": "vllm"}

# ---------------------------------------------------------------------------------------------
# The upstream: a minimal raw ASGI responder (what a model server looks like at zero latency).

_COMPLETION = json.dumps(
    {
        "id": "cmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "bench-raw",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "pong"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()
_SSE = [
    b'data: {"id":"cmpl-bench","object":"chat.completion.chunk","choices":[{"index":0,'
    b'"delta":{"content":"tok%d"}}]}\n\n' % i
    for i in range(8)
] + [b"data: [DONE]\n\n"]

# The token-id case: a long streamed chat answer, byte for byte as vLLM 0.32 writes it, with and
# without the token ids `return_token_ids` asks for (without, vLLM writes the fields as null).
LONG_TOKENS = 256


def _long_sse(ids: bool) -> list[bytes]:
    def dumps(value) -> str:
        return json.dumps(value, separators=(",", ":"))

    head = '{"id":"chatcmpl-bench-long","object":"chat.completion.chunk","created":0,'
    head += '"model":"bench-long","choices":[{"index":0,'
    prompt = dumps(list(range(100, 124))) if ids else "null"
    out = [
        f'data: {head}"delta":{{"role":"assistant","content":""}},"logprobs":null,'
        f'"finish_reason":null}}],"prompt_token_ids":{prompt},"prompt_text":null}}\n\n'
    ]
    for i in range(LONG_TOKENS):
        finish = '"length","stop_reason":null' if i == LONG_TOKENS - 1 else "null"
        token_ids = f"[{1000 + i}]" if ids else "null"
        out.append(
            f'data: {head}"delta":{{"content":" tok{i}"}},"logprobs":null,'
            f'"finish_reason":{finish},"token_ids":{token_ids}}}]}}\n\n'
        )
    return [*(line.encode() for line in out), b"data: [DONE]\n\n"]


_LONG_SSE = {False: _long_sse(False), True: _long_sse(True)}


async def upstream_app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if b'"bench-long"' in body:
        asked = b'"return_token_ids":true' in body or b'"return_token_ids": true' in body
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for chunk in _LONG_SSE[asked]:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if b'"stream": true' in body or b'"stream":true' in body:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for chunk in _SSE:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(_COMPLETION)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": _COMPLETION})


def run_upstream(port: int) -> None:
    uvicorn.run(upstream_app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# ---------------------------------------------------------------------------------------------
# The CPU baseline: a bare asyncio pass-through (asyncio streams on the standard event loop, no
# framework, no routing, no accounting) that relays each request to the same raw upstream over
# one keep-alive connection per client connection and relays its answer back: the same answer
# Haru serves, by the least work that can serve it through a proxy. Haru's CPU per request is
# compared with this one's, in one run.


async def _read_message(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    lower = head.lower()
    at = lower.find(b"content-length:")
    if at < 0:
        return head
    end = lower.index(b"\r\n", at)
    return head + await reader.readexactly(int(lower[at + 15 : end]))


def run_bare(port: int, upstream_port: int) -> None:
    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        try:
            while True:
                up_writer.write(await _read_message(reader))
                writer.write(await _read_message(up_reader))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            up_writer.close()

    async def serve() -> None:
        server = await asyncio.start_server(relay, "127.0.0.1", port)
        await server.serve_forever()

    asyncio.run(serve())


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------
# The load generator: keep-alive connections sending pre-built requests.


def _request(port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines += ["Content-Type: application/json", f"Content-Length: {len(body)}", "", ""]
    return "\r\n".join(lines).encode() + body


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    at = lower.find(b"content-length:")
    if at >= 0:
        end = lower.index(b"\r\n", at)
        await reader.readexactly(int(lower[at + 15 : end]))
        return status
    if b"transfer-encoding: chunked" not in lower:
        raise RuntimeError("response has neither content-length nor chunked encoding")
    while True:
        size = int((await reader.readline()).strip().split(b";")[0], 16)
        await reader.readexactly(size + 2)
        if size == 0:
            return status


async def _worker(port, payload, deadline, warmup_until, latencies, failures):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:
            start = time.perf_counter()
            if start >= deadline:
                return
            writer.write(payload)
            status = await _read_response(reader)
            end = time.perf_counter()
            if status != 200:
                failures.append(status)
            elif start >= warmup_until:
                latencies.append(end - start)
    finally:
        writer.close()


async def _measure(port, payload, concurrency, seconds, warmup, pid=None):
    """Load `port` for warm-up + `seconds`; with `pid`, also that process's CPU per request."""
    latencies: list[float] = []
    failures: list[int] = []
    begin = time.perf_counter()
    warmup_until = begin + warmup
    deadline = warmup_until + seconds
    cpu: list[float] = []

    async def sample_cpu() -> None:
        await asyncio.sleep(warmup_until - time.perf_counter())
        cpu.append(_cpu_seconds(pid))
        await asyncio.sleep(deadline - time.perf_counter())
        cpu.append(_cpu_seconds(pid))

    await asyncio.gather(
        *(
            _worker(port, payload, deadline, warmup_until, latencies, failures)
            for _ in range(concurrency)
        ),
        *([sample_cpu()] if pid is not None else []),
    )
    if failures:
        raise RuntimeError(f"{len(failures)} requests failed, e.g. status {failures[0]}")
    latencies.sort()
    return {
        "rps": len(latencies) / seconds,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
        "n": len(latencies),
        # Requests finishing after the second sample are not counted: one per worker at most.
        **({"cpu_us": (cpu[1] - cpu[0]) / len(latencies) * 1e6} if pid is not None else {}),
    }


# ---------------------------------------------------------------------------------------------
# Processes.


def _wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout} s")


class Processes:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv, env=None) -> subprocess.Popen:
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, killed as one
        )
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen) -> None:
        stop(proc, grace_s=5)

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            self.stop(proc)


def _haru_env(var_dir: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HARU_", "DATABASE_URL"))}
    env.update(
        HARU_VAR_DIR=var_dir,
        HARU_API_TOKEN=TOKEN,
        HARU_DEFAULT_FLEET="bench",
        DJANGO_SETTINGS_MODULE="haru.settings",
    )
    env.pop("REDIS_URL", None)
    return env


def _seed(env: dict[str, str], var_dir: str, upstream_ports: dict[str, int]) -> None:
    models = [
        {
            "name": MODELS[kind],
            "servingUrl": f"http://127.0.0.1:{port}",
            **({"profile": {"engine": ENGINES[kind]}} if kind in ENGINES else {}),
        }
        for kind, port in upstream_ports.items()
    ]
    layout = {
        "slug": "bench",
        "activeDomainSlug": "main",
        "domains": [
            {
                "slug": "main",
                "provider": "static",
                "servingBaseUrl": models[0]["servingUrl"],
                "slots": [{"kind": "inference", "gpuIndex": 0, "models": models}],
            }
        ],
    }
    path = Path(var_dir) / "layout.json"
    path.write_text(json.dumps(layout))
    manage = [PYTHON, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], env=env, cwd=ROOT, check=True)
    subprocess.run(
        [*manage, "seed_layout", "--config", str(path)],
        env=env,
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )


def _start_haru(
    procs: Processes, env, port: int, path: str, client: str = "haru"
) -> subprocess.Popen:
    """Start Haru the way `path` names: lean (manage.py serve), quiet, or django; `client`
    other than haru swaps the proxy's upstream HTTP client (bench/upstream_clients.py)."""
    uvicorn = [PYTHON, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port)]
    uvicorn += ["--log-level", "warning", "--no-access-log", "--lifespan", "off"]
    if client != "haru" and path in ("lean", "quiet"):
        # As manage.py serve runs it (no reconcile loop, proxy headers off), access log on for
        # lean and off for quiet; only the upstream client differs.
        argv = [PYTHON, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--log-level", "info", "--lifespan", "off", "--no-proxy-headers"]
        argv += ["--no-access-log"] * (path == "quiet") + ["bench.upstream_clients:application"]
        env = {**env, "HARU_BENCH_CLIENT": client, "HARU_RECONCILE_INTERVAL_MS": ""}
    elif path == "django":
        # Plain Django (middleware, body buffering) serving bench/django_proxy.py's views.
        argv = [*uvicorn, "--factory", "django.core.asgi:get_asgi_application"]
        env = {**env, "DJANGO_SETTINGS_MODULE": "bench.django_settings"}
    elif path == "quiet":
        # The served app without uvicorn's per-request access log line.
        argv = [*uvicorn, "haru.asgi:application"]
    else:
        argv = [PYTHON, str(ROOT / "manage.py"), "serve", "--host", "127.0.0.1"]
        argv += ["--port", str(port), "--no-reconcile-loop"]
    proc = procs.start(argv, env=env)
    _wait_port(port, proc, "haru")
    return proc


# ---------------------------------------------------------------------------------------------


def _scenarios(model: str, upstream_port: int, haru_port: int):
    messages = [{"role": "user", "content": "ping"}]
    plain = json.dumps({"model": model, "messages": messages})
    stream = json.dumps({"model": model, "stream": True, "messages": messages})
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for kind, body in (("non-streaming", plain), ("streaming", stream)):
        direct = _request(upstream_port, "/v1/chat/completions", body.encode(), {})
        via = _request(haru_port, "/v1/chat/completions", body.encode(), auth)
        yield kind, direct, via


async def _run(args, upstream_ports: dict[str, int], haru_ports: dict[str, int]) -> list[dict]:
    rows = []
    for upstream, upstream_port in upstream_ports.items():
        for label, haru_port in haru_ports.items():
            for kind, direct, via in _scenarios(MODELS[upstream], upstream_port, haru_port):
                for c in args.concurrency:
                    d = await _measure(upstream_port, direct, c, args.seconds, args.warmup)
                    h = await _measure(haru_port, via, c, args.seconds, args.warmup)
                    rows.append(
                        {
                            "upstream": upstream,
                            "path": label,
                            "client": args.client,
                            "kind": kind,
                            "c": c,
                            "direct": d,
                            "haru": h,
                        }
                    )
                    _print_row(rows[-1])
    return rows


async def _cpu_compare(args, bare_port, bare_pid, haru_port, haru_pid, raw_port, raw_pid) -> dict:
    """Process CPU seconds per request: Haru proxying vs two baselines, in one run.

    All serve the same completion bytes to the same load generator at the same concurrency;
    Haru's figure is its own process only (the raw upstream behind it is not counted). The
    baselines: the bare asyncio relay (the least work that can serve the answer through a
    proxy), and the raw upstream itself answering directly (one uvicorn worker with a raw ASGI
    responder: the cost of serving the same answer with no proxy at all).
    """
    _, direct, via = next(_scenarios(MODELS["raw"], raw_port, haru_port))
    bare_request = _request(bare_port, "/v1/chat/completions", direct.split(b"\r\n\r\n", 1)[1], {})
    c, seconds, warmup = args.cpu_concurrency, args.seconds, args.warmup
    # In rounds, each measuring the three back to back: the shared machine's speed drifts by
    # tens of percent within a minute, so a ratio is only meaningful within one round. The
    # figures are the medians over the rounds. Each round then loads Haru and the relay at
    # once (`c` connections each): both see the same machine for the same seconds, so that
    # ratio does not move with the drift, at the price of the two sharing the CPUs.
    rounds, together = [], []
    for _ in range(args.cpu_rounds):
        bare = await _measure(bare_port, bare_request, c, seconds, warmup, pid=bare_pid)
        responder = await _measure(raw_port, direct, c, seconds, warmup, pid=raw_pid)
        haru = await _measure(haru_port, via, c, seconds, warmup, pid=haru_pid)
        rounds.append((bare, responder, haru))
        bare_at_once, haru_at_once = await asyncio.gather(
            _measure(bare_port, bare_request, c, seconds, warmup, pid=bare_pid),
            _measure(haru_port, via, c, seconds, warmup, pid=haru_pid),
        )
        together.append(haru_at_once["cpu_us"] / bare_at_once["cpu_us"])
        print(
            f"  CPU round: haru {haru['cpu_us']:.0f} us, relay {bare['cpu_us']:.0f} us "
            f"({haru['cpu_us'] / bare['cpu_us']:.2f}x), responder {responder['cpu_us']:.0f} us; "
            f"at once: haru {haru_at_once['cpu_us']:.0f} us, relay "
            f"{bare_at_once['cpu_us']:.0f} us ({together[-1]:.2f}x)",
            flush=True,
        )

    def median(values):
        return statistics.median(values)

    def middle_half(values):
        if len(values) < 2:
            return (values[0], values[0])
        q1, _, q3 = statistics.quantiles(values, n=4)
        return (q1, q3)

    ratios = [h["cpu_us"] / b["cpu_us"] for b, _, h in rounds]
    return {
        "c": c,
        "rounds": len(rounds),
        "bare_us": median([b["cpu_us"] for b, _, _ in rounds]),
        "responder_us": median([r["cpu_us"] for _, r, _ in rounds]),
        "haru_us": median([h["cpu_us"] for _, _, h in rounds]),
        "ratio": median(ratios),
        "ratio_middle_half": middle_half(ratios),
        "ratio_together": median(together),
        "ratio_together_middle_half": middle_half(together),
        "ratio_responder": median([h["cpu_us"] / r["cpu_us"] for _, r, h in rounds]),
        "bare_rps": median([b["rps"] for b, _, _ in rounds]),
        "haru_rps": median([h["rps"] for _, _, h in rounds]),
    }


def _print_row(row) -> None:
    d, h = row["direct"], row["haru"]
    print(
        f"{row['upstream']:<4} {row['path']:<6} {row['client']:<7} {row['kind']:<14} "
        f"c={row['c']:<3} "
        f"direct {d['rps']:8.0f} rps p50 {d['p50_ms']:6.2f} ms p99 {d['p99_ms']:6.2f} ms | "
        f"haru {h['rps']:8.0f} rps p50 {h['p50_ms']:6.2f} ms p99 {h['p99_ms']:6.2f} ms | "
        f"throughput {h['rps'] / d['rps']:5.1%}  added p50 {h['p50_ms'] - d['p50_ms']:+.2f} ms",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds first")
    parser.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32]
    )
    parser.add_argument(
        "--upstream",
        type=lambda s: s.split(","),
        default=["raw", "sim"],
        help="upstream kinds to measure against: raw, sim (default both)",
    )
    parser.add_argument(
        "--client",
        choices=["haru", "httpx", "aiohttp"],
        default="haru",
        help="the proxy's upstream HTTP client for the lean and quiet paths (default haru)",
    )
    parser.add_argument(
        "--compare-django",
        action="store_true",
        help="also measure the proxy behind Django's ASGI handler and middleware",
    )
    parser.add_argument(
        "--compare-access-log",
        action="store_true",
        help="also measure haru.asgi under uvicorn without its access log (path 'quiet')",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON at the end")
    parser.add_argument(
        "--cpu-concurrency",
        type=int,
        default=8,
        help="concurrency of the CPU-per-request comparison (0: skip it)",
    )
    parser.add_argument(
        "--cpu-rounds",
        type=int,
        default=5,
        help="rounds of the CPU comparison (relay, responder, Haru back to back); medians",
    )
    parser.add_argument(
        "--token-ids",
        action="store_true",
        help="the token-id case instead: CPU per long streaming request with the proxy's "
        "token-id ledger vs today's pass-through (bench/proxy_token_ids.py)",
    )
    parser.add_argument(
        "--before",
        default=None,
        help="--token-ids: today's code, a checkout directory or a git ref "
        "(default: the last commit before the ledger)",
    )
    parser.add_argument("--serve-raw", type=int, help=argparse.SUPPRESS)  # internal: serve it
    parser.add_argument(
        "--serve-bare", type=int, nargs=2, help=argparse.SUPPRESS
    )  # internal: serve it
    args = parser.parse_args()
    if args.serve_raw:
        run_upstream(args.serve_raw)
        return 0
    if args.serve_bare:
        run_bare(*args.serve_bare)
        return 0

    try:
        import uvloop  # noqa: PLC0415 - optional: the bench runs without it, slower

        uvloop.install()
    except ImportError:
        pass
    if args.token_ids:
        from bench import proxy_token_ids  # noqa: PLC0415 - it imports this module

        args.before = args.before or proxy_token_ids.BEFORE
        return proxy_token_ids.run(args)
    procs = Processes()
    try:
        with tempfile.TemporaryDirectory(prefix="haru-bench-") as var_dir:
            upstream_ports = {kind: free_port() for kind in args.upstream}
            upstream_pids: dict[str, int] = {}
            for kind, port in upstream_ports.items():
                argv = {
                    "raw": [PYTHON, __file__, "--serve-raw", str(port)],
                    "sim": [PYTHON, "-m", "supervisor.sim", "--port", str(port)]
                    + ["--model", MODELS["sim"]],
                }[kind]
                started = procs.start(argv)
                upstream_pids[kind] = started.pid
                _wait_port(port, started, f"{kind} upstream")
            env = _haru_env(var_dir)
            _seed(env, var_dir, upstream_ports)
            paths = ["lean"]
            paths += ["quiet"] * args.compare_access_log + ["django"] * args.compare_django
            haru_ports = {path: free_port() for path in paths}
            haru_procs = {
                path: _start_haru(procs, env, port, path, args.client)
                for path, port in haru_ports.items()
            }
            print(
                f"upstreams {upstream_ports}, haru {haru_ports}, one worker each, "
                f"{args.seconds:g} s per run after {args.warmup:g} s warm-up, "
                f"{os.cpu_count()} CPUs",
                flush=True,
            )
            rows = asyncio.run(_run(args, upstream_ports, haru_ports))
            cpu = None
            if args.cpu_concurrency and "raw" in upstream_ports:
                bare_port = free_port()
                bare = procs.start(
                    [PYTHON, __file__, "--serve-bare", str(bare_port), str(upstream_ports["raw"])]
                )
                _wait_port(bare_port, bare, "bare responder")
                cpu = asyncio.run(
                    _cpu_compare(
                        args,
                        bare_port,
                        bare.pid,
                        haru_ports["lean"],
                        haru_procs["lean"].pid,
                        upstream_ports["raw"],
                        upstream_pids["raw"],
                    )
                )
    finally:
        procs.stop_all()
    print(f"summary (the served path, haru.asgi, upstream client {args.client}):")
    for row in rows:
        if row["path"] != "lean":
            continue
        where = f"{row['upstream']} upstream, {row['kind']}, c={row['c']}"
        if row["c"] == min(args.concurrency):
            added = row["haru"]["p50_ms"] - row["direct"]["p50_ms"]
            print(f"  added p50 latency, {where}: {added:.3f} ms (target < 1 ms)")
        if row["c"] == max(args.concurrency):
            ratio = row["haru"]["rps"] / row["direct"]["rps"]
            print(f"  throughput via haru, {where}: {ratio:.1%} of direct (target >= 50%)")
    if cpu is not None:
        q1, q3 = cpu["ratio_middle_half"]
        print(
            f"  CPU per request, raw upstream, non-streaming, c={args.cpu_concurrency}, median "
            f"of {cpu['rounds']} rounds: haru {cpu['haru_us']:.0f} us, bare asyncio relay "
            f"{cpu['bare_us']:.0f} us, ratio {cpu['ratio']:.2f}x (target <= 2x; middle half "
            f"{q1:.2f}x to {q3:.2f}x)"
        )
        q1, q3 = cpu["ratio_together_middle_half"]
        print(
            f"  CPU per request, haru and the relay loaded at once, median of {cpu['rounds']} "
            f"rounds: ratio {cpu['ratio_together']:.2f}x (middle half {q1:.2f}x to {q3:.2f}x)"
        )
        print(
            f"  CPU per request, the raw upstream answering directly (uvicorn, raw ASGI): "
            f"{cpu['responder_us']:.0f} us; haru / responder {cpu['ratio_responder']:.2f}x"
        )
    if args.json:
        print(json.dumps({"rows": rows, "cpu": cpu} if cpu else rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
