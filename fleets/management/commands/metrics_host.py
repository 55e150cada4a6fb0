"""Serve this host's per-process metrics: `python manage.py metrics_host [--bind ADDR] [--port N]`.

For a worker host that runs no server replica (Celery workers, `reconcile --loop`): the tick
counts and durations and the supervisor call errors its processes write to the host's
`PROMETHEUS_MULTIPROC_DIR` are summed here, as a server's `/metrics` sums its own host's, and
Prometheus scrapes this endpoint as one more target (deploy/prometheus/prometheus.yml). The
database-derived series are left to the server replicas, so nothing is counted twice. Do not run
it on a host with a server replica: that server's `/metrics` already has these series.
"""

from __future__ import annotations

import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from prometheus_client import start_http_server

from fleets.metrics.registry import host_registry, remove_dead_process_files

DEFAULT_PORT = 9708


class Command(BaseCommand):
    help = "Serve this host's per-process Haru metrics for Prometheus (worker hosts)."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default="127.0.0.1", help="address (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default 9708)")

    def handle(self, *args, **opts):
        if not 1 <= opts["port"] <= 65535:
            raise CommandError("--port must be between 1 and 65535")
        directory = settings.PROMETHEUS_MULTIPROC_DIR
        # As `serve` does on its host: files of processes gone since the last start go (a
        # counter reset to Prometheus), so restarts do not pile them up.
        removed = remove_dead_process_files(directory)
        try:
            server, thread = start_http_server(
                opts["port"], addr=opts["bind"], registry=host_registry(directory)
            )
        except OSError as exc:
            raise CommandError(f"cannot listen on {opts['bind']}:{opts['port']}: {exc}") from exc
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_args: stop.set())
        self.stdout.write(
            f"serving {directory} on http://{opts['bind']}:{opts['port']}/metrics "
            f"({removed} file(s) of exited processes removed); Ctrl-C to stop"
        )
        try:
            stop.wait()
        finally:
            server.shutdown()
            thread.join(5)
