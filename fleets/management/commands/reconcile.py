"""Run reconcile ticks from the command line: `python manage.py reconcile [--fleet SLUG] [--loop]`.

Once (the default): one tick of each fleet, each result printed as a JSON line; for cron or
for poking a stuck fleet by hand. With --provision, each tick is followed by a provisioning pass
(each provisioned domain's driver: the `sky` CLI, an operator's script). With --loop: the same
loop the server runs (ticks and provisioning passes), in the foreground, until Ctrl-C.
"""

from __future__ import annotations

import json
import signal
import threading

from django.core.management.base import BaseCommand, CommandError

from fleets.base import stopping
from fleets.base.conf import haru_settings
from fleets.reads.shapes import operation_json
from fleets.reconciler import kick
from fleets.reconciler.loop import ReconcileLoop
from fleets.reconciler.provision import fleet_provision_tick
from fleets.reconciler.tick import fleets_to_reconcile, tick_run


class Command(BaseCommand):
    help = "Run one reconcile tick per fleet, or loop (--loop)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--fleet",
            action="append",
            default=[],
            help="fleet slug or UUID (repeatable; default: HARU_RECONCILE_FLEETS, else all)",
        )
        parser.add_argument("--loop", action="store_true", help="keep ticking until interrupted")
        parser.add_argument(
            "--provision",
            action="store_true",
            help="also run a provisioning pass per fleet after its tick (calls their drivers)",
        )
        parser.add_argument(
            "--interval-ms",
            type=int,
            default=None,
            help="loop interval (default: HARU_RECONCILE_INTERVAL_MS, else 5000)",
        )

    def handle(self, *args, **opts):
        selection = opts["fleet"] or haru_settings().reconcile_fleets
        if opts["loop"]:
            self._loop(selection, opts["interval_ms"])
            return
        ids = fleets_to_reconcile(selection)
        if selection and not ids:
            raise CommandError(f"no such fleet: {', '.join(selection)}")
        for fleet_id in ids:
            result = tick_run(fleet_id=fleet_id, wait_s=10.0, actor="reconcile-command")
            line = {
                "fleetId": result.fleet_id,
                "ran": result.ran,
                "operation": operation_json(result.operation()),
                "nudgeMs": result.nudge_ms,
            }
            if opts["provision"]:
                passed = fleet_provision_tick(fleet_id=fleet_id, actor="reconcile-command")
                line["provisioned"] = {"ran": passed.ran, "busy": passed.busy}
            self.stdout.write(json.dumps(line))

    def _loop(self, selection, interval_ms):
        interval = interval_ms or haru_settings().reconcile_interval_ms or 5000
        if interval < 100:
            raise CommandError("--interval-ms must be at least 100")
        stop = threading.Event()

        def on_signal(*_args: object) -> None:
            # Marked stopping first: a tick running now ends at its next checkpoint instead of
            # failing over hosts that are stopping with this process.
            stopping.begin()
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)
        loop = ReconcileLoop(interval_ms=interval, fleets=selection).start()
        kick.drive(kick.TickDriver(loop.request))
        self.stdout.write(f"reconciling every {interval} ms; Ctrl-C to stop")
        try:
            stop.wait()
        finally:
            loop.stop()
