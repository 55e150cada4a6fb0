"""Seconds from a new active's crash to the failover, behind a promotion whose routing committed
and whose best-effort sleep of the old active keeps failing (issue 11, finding 13).

    .venv/bin/python bench/committed_preemption.py [-n 3] [--sleep-timeout-ms 60000]
                                                   [--start-training-timeout-ms 30000]

Two simulated hosts (supervisor + two sim engines + sim trainer each, from haru/local/), a
temporary embedded store, ticks driven from this process as the e2e tests drive them. Each
round: east serves; west is promoted; east's engines refuse to sleep, so the promotion, its
routing committed, sits in `demote_old_sleep` on east; then west crashes (SIGKILL of its
supervisor and children). It prints crash -> failover requested and crash -> routing moved.
Without pre-emption of committed promotions the failover waits out `sleepTimeoutMs` (the
demotion's training restart is skipped once the sleep was never proven); with it, the tick
that finds west lost ends the promotion and requests the failover.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.failover import setup_django  # noqa: E402
from haru.local.layouts import FAST_POLICY, fleet_layout  # noqa: E402
from haru.local.supervisors import SimHost, put_in_standby_posture  # noqa: E402
from haru.local.ticks import drive  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=3, help="rounds (fresh hosts each)")
    parser.add_argument("--sleep-timeout-ms", type=int, default=60_000)
    parser.add_argument("--start-training-timeout-ms", type=int, default=30_000)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="haru-bench-f13-"))
    setup_django(workdir)
    # After django.setup(): these import models, which need the app registry.
    from fleets.base import clock  # noqa: PLC0415
    from fleets.layouts.loader import parse_layout  # noqa: PLC0415
    from fleets.models import Domain, Event, Fleet, Operation  # noqa: PLC0415
    from fleets.reconciler.steps.base import switch_settle_ms  # noqa: PLC0415
    from fleets.services.layouts import layout_apply  # noqa: PLC0415
    from fleets.services.operations import operation_request  # noqa: PLC0415

    policy = {
        "sleepTimeoutMs": args.sleep_timeout_ms,
        "startTrainingTimeoutMs": args.start_training_timeout_ms,
    }
    bound_s = (args.sleep_timeout_ms + args.start_training_timeout_ms) / 1000 + 30
    requested, moved = [], []
    for i in range(args.n):
        east = SimHost("east", workdir / f"round-{i}")
        west = SimHost("west", workdir / f"round-{i}", start_asleep=True)
        try:
            east.start()
            west.start()
            put_in_standby_posture(west)
            layout = fleet_layout(east, west, policy, slug=f"f13-{i}")
            layout_apply(layout=parse_layout(layout))
            fleet = Fleet.objects.get(slug=layout["slug"])
            drive(fleet.id, lambda f=fleet: all(d.last_seen_at for d in f.domains.all()), 20)
            for model in east.model_ports:
                east.fault(model, sleepFails=True)
            promotion = operation_request(
                fleet=fleet,
                kind="promote",
                target_domain_id=Domain.objects.get(fleet=fleet, slug="west").id,
            ).operation
            assert promotion is not None
            settle_s = switch_settle_ms() / 1000

            def stuck(op=promotion, settle_s=settle_s):
                op.refresh_from_db()
                since = op.step_started_at
                return (
                    op.current_step == "demote_old_sleep"
                    and since is not None
                    and (clock.now() - since).total_seconds() > settle_s + 1
                )

            drive(fleet.id, stuck, 30)
            crashed_at = clock.now()
            west.crash()
            failover = drive(
                fleet.id,
                lambda f=fleet: Operation.objects.filter(fleet=f, reason="auto_failover").first(),
                bound_s,
            )
            switched = drive(
                fleet.id,
                lambda o=failover: Event.objects.filter(
                    operation=o, kind="fleet.route.switched"
                ).first(),
                30,
            )
            promotion.refresh_from_db()
            requested.append((failover.created_at - crashed_at).total_seconds())
            moved.append((switched.created_at - crashed_at).total_seconds())
            print(
                f"round {i + 1}/{args.n}: failover requested {requested[-1]:.2f} s, routing "
                f"moved {moved[-1]:.2f} s after the crash; the stuck promotion ended "
                f"{promotion.state}",
                flush=True,
            )
        finally:
            east.crash()
            west.crash()
    print(
        f"FIGURE f13 behind a committed promotion stuck on the old active's sleep "
        f"(heartbeatStaleMs {FAST_POLICY['heartbeatStaleMs']}, sleepTimeoutMs "
        f"{args.sleep_timeout_ms}, startTrainingTimeoutMs {args.start_training_timeout_ms}, "
        f"{args.n} rounds): new active crashed -> failover "
        f"requested median {statistics.median(requested):.2f} s (max {max(requested):.2f}), "
        f"-> routing moved median {statistics.median(moved):.2f} s (max {max(moved):.2f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
