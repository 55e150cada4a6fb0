"""What the request deadline (haru/postgres/) costs a healthy REST request: timing loops.

    .venv/bin/python bench/request_deadline_cost.py [--url postgres://...] [-n 200000]

Three loops, each against its baseline, best of five rounds:
- the middleware around a view that does nothing (RequestDeadlineMiddleware vs the bare view);
- one psycopg wait that completes at once (a generator with nothing to wait for), through
  psycopg's own `Connection.wait`, `DeadlineConnection.wait` outside a web request, and inside;
- one real round trip (`SELECT 1`) to the PostgreSQL at `--url` (default: DATABASE_URL, else
  the local server), plain psycopg vs a DeadlineConnection inside a request, for scale.
A REST request makes a few round trips and passes the middleware once.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HARU_VAR_DIR", tempfile.mkdtemp(prefix="haru-deadline-bench-"))
os.environ["DJANGO_SETTINGS_MODULE"] = "haru.settings"
# Django itself runs on the embedded default here; the loops connect to --url themselves.
DATABASE_URL = os.environ.pop("DATABASE_URL", None)

import django  # noqa: E402

django.setup()

import psycopg  # noqa: E402
from django.http import HttpResponse  # noqa: E402
from django.test import RequestFactory  # noqa: E402

from haru.postgres import deadline  # noqa: E402
from haru.postgres.middleware import RequestDeadlineMiddleware  # noqa: E402


def best_ns(fn, n: int) -> float:
    """Nanoseconds per call of `fn`, best of five rounds of `n` calls."""
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter_ns() - started) / n)
    return best


def done_at_once():
    """A psycopg generator that needs no I/O: StopIteration at the first next()."""
    return None
    yield  # a generator function


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DATABASE_URL)
    parser.add_argument("-n", type=int, default=200_000)
    args = parser.parse_args()
    url = args.url or "postgres://postgres@127.0.0.1:5432/postgres"
    if url.startswith("sqlite"):
        url = "postgres://postgres@127.0.0.1:5432/postgres"

    request = RequestFactory().get("/v1/fleets/edge")
    response = HttpResponse("ok")

    def view(_request):
        return response

    wrapped = RequestDeadlineMiddleware(view)
    bare_ns = best_ns(lambda: view(request), args.n)
    mw_ns = best_ns(lambda: wrapped(request), args.n)
    print(f"middleware: {mw_ns - bare_ns:8.0f} ns per request ({bare_ns:.0f} -> {mw_ns:.0f})")

    plain = psycopg.Connection.connect(url, autocommit=True)
    ours = deadline.DeadlineConnection.connect(url, autocommit=True)
    base_ns = best_ns(lambda: psycopg.Connection.wait(plain, done_at_once()), args.n)
    outside_ns = best_ns(lambda: ours.wait(done_at_once()), args.n)
    with deadline.scope(5.0):
        inside_ns = best_ns(lambda: ours.wait(done_at_once()), args.n)
    print(
        f"one wait: psycopg {base_ns:.0f} ns; DeadlineConnection outside a request "
        f"+{outside_ns - base_ns:.0f} ns, inside +{inside_ns - base_ns:.0f} ns"
    )

    trips = max(2000, args.n // 50)
    plain_ns = best_ns(lambda: plain.execute("SELECT 1"), trips)
    with deadline.scope(5.0):
        ours_ns = best_ns(lambda: ours.execute("SELECT 1"), trips)
    print(
        f"SELECT 1 round trip: psycopg {plain_ns / 1000:.1f} us, DeadlineConnection in a "
        f"request {ours_ns / 1000:.1f} us (difference {(ours_ns - plain_ns) / 1000:+.1f} us, "
        "within the noise of a round trip)"
    )
    print(
        f"FIGURE request-deadline cost: {(mw_ns - bare_ns) / 1000:.2f} us per request "
        f"(middleware) + {(inside_ns - base_ns) / 1000:.2f} us per database wait"
    )
    plain.close()
    ours.close()


if __name__ == "__main__":
    main()
