"""What one periodic dispatch costs at 10 to 1,000 fleets: statements, messages, CPU.

    DATABASE_URL=postgres://... .venv/bin/python bench/dispatch_cost.py [--sizes 10,100,1000]
        [--repeat 20] [--json]

Against a fresh database (a temporary SQLite file without DATABASE_URL; with it, that database,
whose fleets and leases it replaces), seeds N bare fleets whose tick leases were given back
long ago (the steady state of idle fleets), a tenth of them held by another worker, and runs
Celery beat's `fleets.reconcile_all` with the broker calls counted instead of sent. Prints per
size: the statements of one dispatch (the plan: two queries whatever N), the messages it sends
(batches of 20, plus one follow-up per held fleet) against the two per fleet sent before (one
tick and one provisioning pass each), and its CPU time (median of --repeat runs, this process).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HOLDER = "bench-other-host:4026531836:4242:0f1e2d3c4b5a"


def _setup() -> None:
    if not os.environ.get("DATABASE_URL"):
        os.environ["HARU_VAR_DIR"] = tempfile.mkdtemp(prefix="haru-dispatch-")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "haru.settings")
    import django  # noqa: PLC0415

    django.setup()
    from django.core.management import call_command  # noqa: PLC0415

    call_command("migrate", "--noinput", verbosity=0)


def measure(size: int, repeat: int) -> dict:
    from django.db import connection  # noqa: PLC0415
    from django.test.utils import CaptureQueriesContext  # noqa: PLC0415

    from fleets import tasks  # noqa: PLC0415
    from fleets.base import clock  # noqa: PLC0415
    from fleets.models import Fleet, Lease  # noqa: PLC0415

    Lease.objects.filter(name__startswith="tick:").delete()
    Fleet.objects.all().delete()
    fleets = Fleet.objects.bulk_create(Fleet(slug=f"dispatch-{n}") for n in range(size))
    now = clock.now()
    Lease.objects.bulk_create(
        Lease(
            name=f"tick:{fleet.id}",
            holder=HOLDER if n % 10 == 0 else "",
            expires_at=now + timedelta(seconds=10) if n % 10 == 0 else now - timedelta(minutes=1),
            acquired_at=now - timedelta(minutes=1),
        )
        for n, fleet in enumerate(fleets)
    )
    sent = {"batches": 0, "follow_ups": 0, "provisions": 0}

    def count(kind):
        return lambda *args, **kwargs: sent.__setitem__(kind, sent[kind] + 1)

    tasks.reconcile_batch.apply_async = count("batches")
    tasks.provision_fleet.apply_async = count("provisions")
    tasks.celery_kicker = count("follow_ups")
    with CaptureQueriesContext(connection) as queries:
        tasks.reconcile_all()
    messages = dict(sent)
    cpu = []
    for _ in range(repeat):
        started = time.process_time()
        tasks.reconcile_all()
        cpu.append((time.process_time() - started) * 1000)
    return {
        "fleets": size,
        "statements": len(queries.captured_queries),
        "messages": sum(messages.values()),
        **messages,
        "messages_before": 2 * size,
        "dispatch_cpu_ms": round(statistics.median(cpu), 2),
        "database": connection.vendor,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    _setup()
    runs = [measure(int(size), args.repeat) for size in args.sizes.split(",")]
    if args.json:
        print(json.dumps({"runs": runs}))
        return
    print(f"{'fleets':>7} {'statements':>10} {'messages':>9} {'before':>7} {'cpu ms':>8}  db")
    for run in runs:
        print(
            f"{run['fleets']:>7} {run['statements']:>10} {run['messages']:>9} "
            f"{run['messages_before']:>7} {run['dispatch_cpu_ms']:>8}  {run['database']}"
        )


if __name__ == "__main__":
    main()
