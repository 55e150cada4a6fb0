"""Run the ASGI server: `python manage.py serve [--host H] [--port P] [--workers N]`.

Without HARU_API_TOKEN the API is open, so it binds loopback only and warns loudly; asked to bind
elsewhere without a token it refuses to start.
"""

from __future__ import annotations

import logging
import os
import signal

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from uvicorn.supervisors import Multiprocess

from common.loopback import is_loopback
from common.private_apis import serve_workers_with
from fleets.base import stopping
from fleets.base.conf import haru_settings
from fleets.base.setting_table import HaruSettings
from fleets.metrics import snapshot
from fleets.metrics.registry import remove_dead_process_files
from fleets.proxy.drain import graceful_config
from fleets.server.driver import SERVE_WORKER_ENV, start_for_server
from fleets.server.protocol import HaruHttpProtocol, current_limits
from fleets.server.shutdown import StoppingProcess, StoppingServer

log = logging.getLogger("haru.serve")


class Command(BaseCommand):
    help = "Serve the Haru API, chat proxy and dashboard over ASGI (uvicorn, bounded edges)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--host",
            default=None,
            help="bind address (default 0.0.0.0 with a token, else 127.0.0.1)",
        )
        parser.add_argument("--port", type=int, default=None, help="default: PORT, else 8700")
        parser.add_argument("--workers", type=int, default=1)
        parser.add_argument(
            "--access-log",
            action="store_true",
            help="log every request (off by default: it costs the chat proxy about a third of "
            "its throughput; /metrics counts requests instead)",
        )
        parser.add_argument(
            "--no-reconcile-loop",
            action="store_true",
            help="do not run the in-process reconcile loop",
        )

    def handle(self, *args, **opts):
        token = haru_settings().api_token
        host = opts["host"] or ("0.0.0.0" if token else "127.0.0.1")
        port = opts["port"] or haru_settings().port
        if not token:
            if not is_loopback(host):
                raise CommandError(
                    f"refusing to bind {host} without HARU_API_TOKEN: the API would be open to "
                    f"the network. Set HARU_API_TOKEN or bind 127.0.0.1."
                )
            log.warning(
                "!!! HARU_API_TOKEN is not set: the API is UNAUTHENTICATED and bound to "
                "%s only. Set HARU_API_TOKEN before exposing this server. !!!",
                host,
            )
        if opts["no_reconcile_loop"]:
            os.environ[HaruSettings.reconcile_interval_ms.env] = ""  # workers re-read settings
        removed = remove_dead_process_files(settings.PROMETHEUS_MULTIPROC_DIR)
        # A snapshot of the database's series left by an earlier server is not this one's to
        # serve (its first scrape computes them: fleets/metrics/snapshot.py).
        snapshot.remove(settings.PROMETHEUS_MULTIPROC_DIR)
        log.info(
            "metrics: %s (removed %d files of exited processes)",
            settings.PROMETHEUS_MULTIPROC_DIR,
            removed,
        )
        workers = opts["workers"]
        if workers < 1:
            raise CommandError("--workers must be at least 1")
        limits = current_limits()  # also raises this process's open-file limit to fit the cap
        log.info(
            "server edge: headers within %gs, body within %gs, keep-alive idle %gs, headers at "
            "most %d bytes and %d fields, at most %d connections per process",
            limits.header_timeout_s,
            limits.body_timeout_s,
            limits.keepalive_timeout_s,
            limits.max_header_bytes,
            limits.max_headers,
            limits.max_connections,
        )
        driver = None
        if not opts["no_reconcile_loop"]:
            # One process: it serves and ticks. Several: this parent ticks every fleet each
            # interval, and each worker drives the ticks of what it accepted (haru/asgi.py reads
            # the variable), all under the fleets' tick leases (fleets/server/driver.py).
            driver = start_for_server(role="single" if workers == 1 else "parent")
            if workers > 1:
                os.environ[SERVE_WORKER_ENV] = "1"
        self.stdout.write(f"haru serving on http://{host}:{port}")
        config = graceful_config(
            app="haru.asgi:application",
            host=host,
            port=port,
            workers=workers,
            log_level="info",
            access_log=opts["access_log"],
            lifespan="off",
            proxy_headers=False,
            # Deadlines and limits at the edge, keep-alive included
            # (fleets/server/protocol.py); each worker process reads the same settings.
            http=HaruHttpProtocol,
        )
        server = StoppingServer(config)
        try:
            if config.workers > 1:
                # uvicorn's supervisor builds its worker processes from this module global, and
                # each builds its own Server: have them build ours, so every worker drains
                # (readiness first, held requests answered) on SIGTERM.
                serve_workers_with(StoppingProcess)
                parent = Multiprocess(config, sockets=[config.bind_socket()])
                # This parent ticks every fleet: its stop must reach its ticks at once, not
                # after its workers have drained (uvicorn's handlers, installed just above,
                # keep their meaning).
                stopping.mark_first_on((signal.SIGINT, signal.SIGTERM))
                parent.run()
            else:
                server.run()
        finally:
            if driver is not None:
                driver.stop()
