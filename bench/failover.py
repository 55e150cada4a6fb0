"""Benchmark automatic failover on the simulated fleet: where the seconds go.

    .venv/bin/python bench/failover.py [-n 10] [--wake-latency-ms 400] [--interval-ms 100]
                                       [--stale-ms 1000] [--trainer-save-ms 0]

Starts two simulated hosts (supervisor + two sim engines + sim trainer each, from the local
launcher), a temporary embedded state store and the server's in-process reconcile loop. Each
round crashes the active host (supervisor and children, SIGKILL), waits for the automatic
promotion of the standby to commit routing, then restarts the crashed host and demotes it back
into standby posture for the next round (the roles alternate).

Per round: detection (crash -> the tick that requested the promotion), each step's duration,
total (crash -> routing committed), the outage Haru recorded (failoverMs: from its outage start,
the last good sighting of the active or the first failed request, to the commit; at least
total) and control-plane overhead = total - detection - configured wake latency. Prints median
and p95 of each. Detection is set by the policy (heartbeat interval, staleness, and the
data-path confirmation when the host's processes are gone); the overhead is what Haru adds on
top of the engines' own latencies, including the trainer's exit (`--trainer-save-ms`, the time
a trainer takes to checkpoint on SIGTERM).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The local launcher (haru/local/) runs simulated hosts on free ports.
from haru.local.layouts import fleet_layout  # noqa: E402
from haru.local.supervisors import TOKEN, SimHost, put_in_standby_posture  # noqa: E402

STEPS = ("stop_training", "verify_gpu", "wake", "probe", "switch_route")


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def setup_django(workdir: Path) -> None:
    os.environ.pop("DATABASE_URL", None)
    os.environ.pop("REDIS_URL", None)
    os.environ["HARU_VAR_DIR"] = str(workdir / "var")
    os.environ["HARU_SUPERVISOR_TOKEN"] = TOKEN
    os.environ["DJANGO_SETTINGS_MODULE"] = "haru.settings"
    import django  # noqa: PLC0415 - imported after the environment above selects the settings

    django.setup()
    # Django's app registry must be ready before anything that touches models is imported.
    from django.core.management import call_command  # noqa: PLC0415 - needs django.setup() (the app registry) first

    call_command("migrate", "--noinput", verbosity=0)


def wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise SystemExit(f"bench: timed out waiting for {what}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=10, help="failovers to run")
    parser.add_argument("--wake-latency-ms", type=int, default=400)
    parser.add_argument("--interval-ms", type=int, default=100, help="reconcile loop interval")
    parser.add_argument("--stale-ms", type=int, default=1000, help="heartbeatStaleMs")
    parser.add_argument("--trainer-save-ms", type=int, default=0)
    parser.add_argument("--verbose", action="store_true", help="print each round's events")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="haru-bench-failover-"))
    setup_django(workdir)
    # After django.setup(): these import models, which need the app registry.

    from fleets.base import clock  # noqa: PLC0415 - needs django.setup() (the app registry) first
    from fleets.layouts.loader import parse_layout  # noqa: PLC0415 - needs django.setup() (the app registry) first
    from fleets.models import Domain, Event, Fleet, Operation  # noqa: PLC0415 - needs django.setup() (the app registry) first
    from fleets.reads.sightings import overlaid  # noqa: PLC0415 - needs django.setup() (the app registry) first
    from fleets.reconciler import kick  # noqa: PLC0415 - needs django.setup() (the app registry) first
    from fleets.reconciler.loop import ReconcileLoop  # noqa: PLC0415 - needs django.setup() (the app registry) first
    from fleets.services.layouts import layout_apply  # noqa: PLC0415 - needs django.setup() (the app registry) first
    from fleets.services.operations import operation_request  # noqa: PLC0415 - needs django.setup() (the app registry) first

    trainer = ("--sigterm-save-s", str(args.trainer_save_ms / 1000))
    hosts = {
        name: SimHost(
            name,
            workdir,
            wake_latency_ms=args.wake_latency_ms,
            trainer_args=trainer,
            start_asleep=(name == "west"),
        )
        for name in ("east", "west")
    }
    policy = {
        "heartbeatStaleMs": args.stale_ms,
        "sleepTimeoutMs": 1500,
        "startTrainingTimeoutMs": 1500,
        "wakeTimeoutMs": max(10_000, 5 * args.wake_latency_ms),
        "trainingStopGraceMs": 2000,
    }
    loop = None
    rounds: list[dict[str, float]] = []
    try:
        for host in hosts.values():
            host.start()
        put_in_standby_posture(hosts["west"])
        layout_apply(layout=parse_layout(fleet_layout(hosts["east"], hosts["west"], policy)))
        fleet = Fleet.objects.get(slug="e2e")
        loop = ReconcileLoop(interval_ms=args.interval_ms, fleets=[fleet.slug]).start()
        kick.drive(kick.TickDriver(loop.request))

        def calm():
            fleet.refresh_from_db()
            if Operation.objects.filter(fleet=fleet, state__in=["pending", "running"]).exists():
                return None
            # Last seen as Haru reads it: a healthy host's sighting may be on the tick lease only.
            domains = {
                d.slug: d for d in overlaid(list(Domain.objects.filter(fleet=fleet)), [fleet.id])
            }
            standby = next(d for d in domains.values() if d.id != fleet.active_domain_id)
            # Recently seen by a heartbeat: a never-seen active is never stale, by design.
            fresh = clock.now() - _ms(3 * args.interval_ms + 200)
            ok = all(
                d.state == "ready" and d.last_seen_at and d.last_seen_at > fresh
                for d in domains.values()
            )
            slots = standby.slots.filter(kind="inference", state="sleeping").exists()
            return ok and slots and domains

        for i in range(args.n):
            domains = wait(calm, 30, "a calm fleet")
            active = next(d for d in domains.values() if d.id == fleet.active_domain_id)
            killed_at = clock.now()
            hosts[active.slug].crash()
            op = wait(
                lambda k=killed_at: Operation.objects.filter(
                    fleet=fleet, reason="auto_failover", created_at__gte=k, routing_committed=True
                ).first(),
                60,
                "the failover",
            )
            # routing_committed lands a moment before the step is recorded: wait for both.
            wait(
                lambda o=op: Event.objects.filter(
                    operation=o, kind="operation.step.done", step="switch_route"
                ).exists(),
                10,
                "the switch_route step",
            )
            switched = Event.objects.get(operation=op, kind="fleet.route.switched")
            done = {
                e.step: e.duration_ms
                for e in Event.objects.filter(operation=op, kind="operation.step.done")
            }
            row = {s: float(done[s]) for s in STEPS}
            # Detection: from the crash to the tick that requested the promotion. The recorded
            # outage (failoverMs, haru_failover_duration_seconds) runs from Haru's outage start
            # (the last good sighting of the active) to the commit: it must cover the true
            # one, crash -> commit, never understate it.
            row["detection"] = (op.created_at - killed_at).total_seconds() * 1000
            row["total"] = (switched.created_at - killed_at).total_seconds() * 1000
            switch_done = Event.objects.get(
                operation=op, kind="operation.step.done", step="switch_route"
            )
            row["recorded outage"] = float(switch_done.data["failoverMs"])
            row["overhead"] = row["total"] - row["detection"] - args.wake_latency_ms
            rounds.append(row)
            if args.verbose:
                for e in Event.objects.filter(created_at__gte=killed_at).order_by("id"):
                    at = (e.created_at - killed_at).total_seconds() * 1000
                    print(f"    +{at:7.1f} ms  {e.kind} {e.step}".rstrip())
            print(
                f"round {i + 1}/{args.n}: {active.slug} down, total {row['total']:.0f} ms, "
                f"overhead {row['overhead']:.0f} ms",
                flush=True,
            )
            # Back to a standby: the crashed host returns and is demoted (sleep, train).
            wait(
                lambda o=op: Operation.objects.filter(pk=o.pk, state="succeeded").exists(),
                30,
                "the best-effort steps",
            )
            hosts[active.slug].restart()
            wait(
                lambda a=active: any(
                    d.state == "ready"
                    and d.last_seen_at is not None
                    and d.last_seen_at > clock.now() - _ms(500)
                    for d in overlaid(list(Domain.objects.filter(pk=a.pk)), [fleet.id])
                ),
                30,
                "the crashed host back",
            )
            demote = operation_request(
                fleet=fleet, kind="demote", target_domain_id=active.id
            ).operation
            wait(
                lambda d=demote: Operation.objects.filter(pk=d.pk, state="succeeded").exists(),
                30,
                "the demotion",
            )
    finally:
        if loop is not None:
            loop.stop()
        for host in hosts.values():
            host.crash()

    print()
    print(
        f"{len(rounds)} failovers; wake latency {args.wake_latency_ms} ms, loop every "
        f"{args.interval_ms} ms, heartbeatStaleMs {args.stale_ms}, trainer save "
        f"{args.trainer_save_ms} ms"
    )
    print(f"{'phase':<34}{'median ms':>12}{'p95 ms':>10}")
    for key in ("detection", *STEPS, "total", "recorded outage", "overhead"):
        label = "overhead (total-detection-wake)" if key == "overhead" else key
        values = [r[key] for r in rounds]
        print(f"{label:<34}{statistics.median(values):>12.1f}{p95(values):>10.1f}")
    return 0


def _ms(value: int):
    return timedelta(milliseconds=value)


if __name__ == "__main__":
    raise SystemExit(main())
