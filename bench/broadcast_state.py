"""Benchmark the live layer's state read: the raw-SQL statement against the ORM it replaced.

    .venv/bin/python bench/broadcast_state.py [-n 2000] [--rounds 5]

`fleets.services.broadcast.fleet_state` runs in the commit hook of every state change (each event is
announced with the fleet's pointer and its operation), so it is written as one raw statement.
This keeps the measurement that justifies it runnable: the same answer read by the ORM (the
fleet's row, then the event's operation or the one in flight, rendered by the same shapes),
timed in one process against one database, alternating rounds so the machine's drift hits both.
Prints microseconds per read for each, and their ratio, per round and as medians.

Uses a fresh SQLite database (the embedded default) in a temporary directory, or the database
`DATABASE_URL` names (point it at a scratch database: the bench migrates and writes to it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def setup_django(workdir: Path) -> None:
    os.environ.pop("REDIS_URL", None)
    os.environ["HARU_VAR_DIR"] = str(workdir / "var")
    os.environ["DJANGO_SETTINGS_MODULE"] = "haru.settings"
    import django  # noqa: PLC0415 - imported after the environment above selects the settings

    django.setup()
    from django.core.management import call_command  # noqa: PLC0415 - needs django.setup()

    call_command("migrate", "--noinput", verbosity=0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=2000, help="reads per round and way")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    setup_django(Path(tempfile.mkdtemp(prefix="haru-bench-broadcast-")))
    # After django.setup(): these import models, which need the app registry.
    from fleets.core.states import IN_FLIGHT_OPERATION_STATES  # noqa: PLC0415 - needs django.setup() (the app registry) first
    from fleets.layouts.loader import load_layout  # noqa: PLC0415 - needs django.setup() (the app registry) first
    from fleets.models import Fleet, Operation  # noqa: PLC0415 - needs django.setup() (the app registry) first
    from fleets.reads import shapes  # noqa: PLC0415 - needs django.setup() (the app registry) first
    from fleets.services import broadcast  # noqa: PLC0415 - needs django.setup() (the app registry) first
    from fleets.services.layouts import layout_apply  # noqa: PLC0415 - needs django.setup() (the app registry) first
    from fleets.services.operations import operation_request  # noqa: PLC0415 - needs django.setup() (the app registry) first

    layout = load_layout(ROOT / "examples" / "fleet.two-domain.json")
    layout_apply(layout=layout, actor="bench")
    fleet = Fleet.objects.get(slug=layout.slug)
    standby = fleet.domains.exclude(pk=fleet.active_domain_id).first()
    assert standby is not None
    op = operation_request(
        fleet=fleet, kind="demote", target_domain_id=str(standby.id), actor="bench"
    ).operation
    assert op is not None

    def orm_state(fleet_id: object, operation_id: object = None) -> dict | None:
        # Whole rows, as the ORM reads them naturally: the renderers read more fields of an
        # operation than the live message keeps, and a deferred field is a query of its own.
        pointer = Fleet.objects.filter(pk=fleet_id).first()
        if pointer is None:
            return None
        operation = (
            Operation.objects.filter(pk=operation_id).first()
            if operation_id
            else Operation.objects.filter(
                fleet_id=fleet_id, state__in=IN_FLIGHT_OPERATION_STATES
            ).first()
        )
        return {
            **shapes.fleet_pointer_json(pointer),
            "operation": shapes.live_operation_json(operation),
        }

    raw = broadcast.fleet_state(fleet.id, op.id)
    assert raw == orm_state(fleet.id, op.id), (raw, orm_state(fleet.id, op.id))

    def per_read_us(read: Callable[..., object]) -> float:
        started = time.perf_counter()
        for _ in range(args.n):
            read(fleet.id, op.id)
        return (time.perf_counter() - started) / args.n * 1e6

    from django.db import connection  # noqa: PLC0415 - needs django.setup()

    print(f"database: {connection.vendor}; {args.n} reads per round and way")
    raws, orms = [], []
    for i in range(args.rounds):
        r, o = per_read_us(broadcast.fleet_state), per_read_us(orm_state)
        raws.append(r)
        orms.append(o)
        print(f"round {i + 1}: raw SQL {r:7.1f} us, ORM {o:7.1f} us, ORM/raw {o / r:4.2f}x")
    r, o = statistics.median(raws), statistics.median(orms)
    print(f"median:  raw SQL {r:7.1f} us, ORM {o:7.1f} us, ORM/raw {o / r:4.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
