"""What a stopped PostgreSQL costs the REST API and /metrics: seconds to each answer.

    .venv/bin/python bench/stopped_database.py [-n 8] [--rounds 5] [--down-s 0] [--cap-s 40]
                                               [--json]

Starts a PostgreSQL cluster of its own and `manage.py serve` on it with Haru's default database
settings (one fleet routed to a fast model-server double), warms the connection pool, then
stops the cluster (`pg_ctl stop -m fast`: connections refused from then on). While it is
stopped: `--rounds` rounds of `-n` concurrent REST requests (`GET /v1/fleets/edge`) and one
`/metrics` scrape, one round after the other, then it stays stopped until `--down-s` seconds
have passed (psycopg_pool's reconnection backs off meanwhile). Each request has `--cap-s`
seconds. Then the cluster is started again and the time until REST answers 200 is measured,
without a restart of the server.

Prints one line per round, the server log's tracebacks and outage lines, and a FIGURE line (or,
with `--json`, one JSON object) for the closing note. Issue 29's target: each 503 and each
/metrics answer within 1 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from haru.local.backing import OwnPostgres  # noqa: E402
from haru.local.layouts import single_upstream_layout  # noqa: E402
from haru.local.processes import wait_for  # noqa: E402
from haru.local.server import Serve, prepare, server_env  # noqa: E402
from haru.local.upstream import start_upstream  # noqa: E402

MODEL = "edge-model"


def _timed(send) -> tuple[str, float, str]:
    started = time.monotonic()
    try:
        response = send()
        outcome, body = str(response.status_code), response.text
    except httpx.TimeoutException:
        outcome, body = "hung", ""
    except httpx.HTTPError as exc:
        outcome, body = type(exc).__name__, ""
    return outcome, time.monotonic() - started, body


def _round(url: str, n: int, cap_s: float) -> dict:
    """`n` concurrent REST requests, then one /metrics scrape."""
    rest: list[tuple[str, float, str]] = []
    lock = threading.Lock()

    def one() -> None:
        with httpx.Client(base_url=url, timeout=cap_s, trust_env=False) as c:
            result = _timed(lambda: c.get("/v1/fleets/edge"))
        with lock:
            rest.append(result)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with httpx.Client(base_url=url, timeout=cap_s, trust_env=False) as c:
        outcome, seconds, body = _timed(lambda: c.get("/metrics"))
    store_down = "haru_state_store_up 0.0" in body
    return {
        "rest_statuses": sorted({r[0] for r in rest}),
        "rest_max_s": round(max(r[1] for r in rest), 3),
        "rest_median_s": round(sorted(r[1] for r in rest)[n // 2], 3),
        "metrics_status": outcome,
        "metrics_s": round(seconds, 3),
        "metrics_says_store_down": store_down,
        "metrics_series": sum(1 for line in body.splitlines() if line and line[0] != "#"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=8, help="concurrent REST requests per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--down-s", type=float, default=0.0, help="least time stopped")
    parser.add_argument("--cap-s", type=float, default=40.0, help="client timeout per request")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="haru-stopped-bench-"))
    pg = OwnPostgres().init()
    upstream_port, upstream_loop = start_upstream()
    serve = None
    try:
        pg.create_database("haru")
        env = server_env(work, DATABASE_URL=pg.url("haru"), HARU_DEFAULT_FLEET="edge")
        prepare(env, work, single_upstream_layout("edge", MODEL, upstream_port))
        serve = Serve(env, work)
        healthy = _round(serve.url, args.n, args.cap_s)
        assert healthy["rest_statuses"] == ["200"], healthy
        log_before = len(serve.log.read_text())

        pg.stop()
        stopped_at = time.monotonic()
        rounds = [_round(serve.url, args.n, args.cap_s) for _ in range(args.rounds)]
        time.sleep(max(0.0, args.down_s - (time.monotonic() - stopped_at)))
        stopped_s = time.monotonic() - stopped_at
        pg.start()
        started_at = time.monotonic()

        def rest_ok() -> bool:
            with httpx.Client(base_url=serve.url, timeout=10, trust_env=False) as c:
                return c.get("/v1/fleets/edge").status_code == 200

        wait_for(rest_ok, 60, "REST 200 after the restart", every=0.05)
        back_s = time.monotonic() - started_at
        log = serve.log.read_text()[log_before:]
        result = {
            "bench": "stopped_database",
            "concurrent_rest": args.n,
            "healthy": healthy,
            "rounds": rounds,
            "stopped_s": round(stopped_s, 2),
            "rest_503_max_s": max(r["rest_max_s"] for r in rounds),
            "metrics_max_s": max(r["metrics_s"] for r in rounds),
            "tracebacks_in_log": log.count("Traceback"),
            "outage_log_lines": log.count("database unavailable"),
            "rest_200_after_restart_s": round(back_s, 2),
        }
        if args.json:
            print(json.dumps(result))
            return
        for i, r in enumerate(rounds, 1):
            print(
                f"round {i}: REST {'/'.join(r['rest_statuses'])} max {r['rest_max_s']:.2f} s "
                f"(median {r['rest_median_s']:.2f} s); /metrics {r['metrics_status']} in "
                f"{r['metrics_s']:.2f} s, {r['metrics_series']} series, store down said: "
                f"{r['metrics_says_store_down']}"
            )
        print(f"tracebacks in the server log: {result['tracebacks_in_log']}")
        print(f"'database unavailable' lines: {result['outage_log_lines']}")
        print(
            f"FIGURE stopped-database: {args.n} concurrent REST requests x {args.rounds} rounds: "
            f"503 within {result['rest_503_max_s']:.2f} s; /metrics within "
            f"{result['metrics_max_s']:.2f} s; stopped {stopped_s:.0f} s, REST 200 "
            f"{back_s:.2f} s after the restart"
        )
    finally:
        if serve is not None:
            serve.stop()
        pg.destroy()
        upstream_loop.call_soon_threadsafe(upstream_loop.stop)


if __name__ == "__main__":
    main()
