"""What a frozen PostgreSQL does to the REST API and the dashboard: time to each answer.

    .venv/bin/python bench/frozen_database.py [-n 8] [--cap-s 30] [--deadline-ms 5000]
                                              [--pool-timeout-ms 5000] [--warm 8]

Starts a PostgreSQL cluster of its own, `manage.py serve` on it (a staff login, one fleet routed
to a fast model-server double), warms the connection pool with `--warm` concurrent REST
requests, then SIGSTOPs every postgres process (the kernel still accepts and acknowledges; no
process answers) and sends, all at once, `-n` REST requests (`GET /v1/fleets/edge`), one
dashboard page (`/`, with a staff session), one `/healthz` (a Django view that reads nothing)
and one chat request; once they are answered, a second wave of `-n` REST requests, still
frozen. Each has `--cap-s` seconds; one that gets no answer by then is "hung". Then SIGCONT,
and the time until REST answers 200 again, without a restart.

Prints one line per request (status, seconds, Retry-After), the server's thread count while
the requests were held, the server log's tracebacks, and a FIGURE line for the closing note.
`--deadline-ms` sets HARU_DB_REQUEST_DEADLINE_MS (ignored by a server that has no such setting).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The local launcher runs a cluster of its own, the model-server double and `serve`.
from haru.local.backing import OwnPostgres  # noqa: E402
from haru.local.layouts import single_upstream_layout  # noqa: E402
from haru.local.processes import wait_for  # noqa: E402
from haru.local.server import Serve, prepare, server_env, staff_client  # noqa: E402
from haru.local.upstream import start_upstream  # noqa: E402

STAFF = ("ops", "ops-password-0123456789")
MODEL = "edge-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "ping"}]}


def threads_of(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=8, help="concurrent REST requests")
    parser.add_argument("--cap-s", type=float, default=30.0, help="client timeout per request")
    parser.add_argument("--deadline-ms", type=int, default=None)
    parser.add_argument("--pool-timeout-ms", type=int, default=None)
    parser.add_argument("--warm", type=int, default=8, help="concurrent warm-up requests")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="haru-frozen-bench-"))
    pg = OwnPostgres().init()
    upstream_port, upstream_loop = start_upstream()
    serve = None
    try:
        pg.create_database("haru")
        extra = {"DATABASE_URL": pg.url("haru"), "HARU_DEFAULT_FLEET": "edge"}
        if args.deadline_ms is not None:
            extra["HARU_DB_REQUEST_DEADLINE_MS"] = str(args.deadline_ms)
        if args.pool_timeout_ms is not None:
            extra["HARU_DB_POOL_TIMEOUT_MS"] = str(args.pool_timeout_ms)
        env = server_env(work, **extra)
        prepare(env, work, single_upstream_layout("edge", MODEL, upstream_port), staff=STAFF)
        serve = Serve(env, work)
        staff = staff_client(serve.url, STAFF)
        assert staff.get("/").status_code == 200

        # Warm the pool: concurrent requests make it lend (and so open) several connections.
        def warm() -> None:
            with httpx.Client(base_url=serve.url, timeout=20) as c:
                for _ in range(5):
                    assert c.get("/v1/fleets/edge").status_code == 200

        warmers = [threading.Thread(target=warm) for _ in range(args.warm)]
        for t in warmers:
            t.start()
        for t in warmers:
            t.join()
        with httpx.Client(base_url=serve.url, timeout=20) as c:
            assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        threads_before = threads_of(serve.proc.pid)
        log_before = len(serve.log.read_text())

        results: list[tuple[str, str, float, str]] = []
        lock = threading.Lock()

        def one(label: str, send) -> None:
            started = time.monotonic()
            try:
                response = send()
                outcome, retry = str(response.status_code), response.headers.get("retry-after", "")
            except httpx.TimeoutException:
                outcome, retry = "hung", ""
            except httpx.HTTPError as exc:
                outcome, retry = type(exc).__name__, ""
            with lock:
                results.append((label, outcome, time.monotonic() - started, retry))

        def rest() -> httpx.Response:
            with httpx.Client(base_url=serve.url, timeout=args.cap_s) as c:
                return c.get("/v1/fleets/edge")

        def plain(method: str, path: str, **kw):
            def send() -> httpx.Response:
                with httpx.Client(base_url=serve.url, timeout=args.cap_s) as c:
                    return c.request(method, path, **kw)

            return send

        def page() -> httpx.Response:
            return staff.get("/", timeout=args.cap_s)

        pg.signal_all(signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            senders = [(f"rest-{i}", rest) for i in range(args.n)]
            senders += [("dashboard", page), ("healthz", plain("GET", "/healthz"))]
            senders += [("chat", plain("POST", "/v1/chat/completions", json=CHAT))]
            threads = [threading.Thread(target=one, args=s) for s in senders]
            for t in threads:
                t.start()
            time.sleep(min(2.0, args.cap_s / 2))
            threads_held = threads_of(serve.proc.pid)
            for t in threads:
                t.join()
            # Still frozen: a second wave meets a process that already knows it is.
            second = [
                threading.Thread(target=one, args=(f"again-{i}", rest)) for i in range(args.n)
            ]
            for t in second:
                t.start()
            for t in second:
                t.join()
        finally:
            pg.signal_all(signal.SIGCONT)
        thawed_at = time.monotonic()
        print(f"frozen for {thawed_at - frozen_at:.1f} s")

        def rest_ok() -> bool:
            with httpx.Client(base_url=serve.url, timeout=5) as c:
                return c.get("/v1/fleets/edge").status_code == 200

        wait_for(rest_ok, 60, "REST 200 after SIGCONT", every=0.05)
        back_s = time.monotonic() - thawed_at
        page_after = staff.get("/").status_code

        order = {label: i for i, (label, _) in enumerate(senders)}
        order.update({f"again-{i}": len(order) + i for i in range(args.n)})
        for label, outcome, seconds, retry in sorted(results, key=lambda r: order[r[0]]):
            print(f"  {label:10} {outcome:>5} {seconds:6.2f} s  retry-after={retry or '-'}")
        log = serve.log.read_text()[log_before:]
        print(f"server threads: {threads_before} before, {threads_held} while held")
        print(f"tracebacks in the server log: {log.count('Traceback')}")
        print(f"'database unavailable' lines: {log.count('database unavailable')}")
        print(f"after SIGCONT: REST 200 in {back_s:.2f} s, dashboard {page_after}")

        def summary(rows: list[tuple[str, str, float, str]]) -> str:
            hung = sum(1 for r in rows if r[1] == "hung")
            times = [r[2] for r in rows if r[1] == "503"]
            text = f"{len(times)} got 503"
            if times:
                text += f" in {min(times):.2f}-{max(times):.2f} s"
            return text + (f", {hung} hung past {args.cap_s:g} s" if hung else "")

        page_result = next(r for r in results if r[0] == "dashboard")
        print(
            f"FIGURE frozen-database: {args.n} concurrent REST requests: "
            f"{summary([r for r in results if r[0].startswith('rest-')])}; "
            f"dashboard {page_result[1]} in {page_result[2]:.2f} s; "
            f"{args.n} more, still frozen: "
            f"{summary([r for r in results if r[0].startswith('again-')])}; "
            f"REST 200 again {back_s:.2f} s after SIGCONT"
        )
    finally:
        if serve is not None:
            serve.stop()
        pg.destroy()
        upstream_loop.call_soon_threadsafe(upstream_loop.stop)


if __name__ == "__main__":
    main()
