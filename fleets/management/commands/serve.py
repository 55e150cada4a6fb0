"""Run the ASGI server: `python manage.py serve [--host H] [--port P] [--workers N]`.

Without HARU_API_TOKEN the API is open, so it binds loopback only and warns loudly; asked to bind
elsewhere without a token it refuses to start.
"""

from __future__ import annotations

import ipaddress
import logging
import os

import uvicorn
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from fleets.metrics import remove_dead_process_files
from fleets.reconciler import kick
from fleets.reconciler.loop import ReconcileLoop
from fleets.server.protocol import HaruHttpProtocol, current_limits
from fleets.tasks import celery_kicker

log = logging.getLogger("haru.serve")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
        token = settings.HARU["api_token"]
        host = opts["host"] or ("0.0.0.0" if token else "127.0.0.1")
        port = opts["port"] or settings.HARU["port"]
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
            os.environ["HARU_RECONCILE_INTERVAL_MS"] = ""  # workers re-read settings
        removed = remove_dead_process_files(settings.PROMETHEUS_MULTIPROC_DIR)
        log.info(
            "metrics: %s (removed %d files of exited processes)",
            settings.PROMETHEUS_MULTIPROC_DIR,
            removed,
        )
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
        loop = None if opts["no_reconcile_loop"] else _start_tick_driver()
        self.stdout.write(f"haru serving on http://{host}:{port}")
        try:
            uvicorn.run(
                "haru.asgi:application",
                host=host,
                port=port,
                workers=opts["workers"],
                log_level="info",
                access_log=opts["access_log"],
                lifespan="off",
                proxy_headers=False,
                # Deadlines and limits at the edge, keep-alive included
                # (fleets/server/protocol.py); each worker process reads the same settings.
                http=HaruHttpProtocol,
            )
        finally:
            if loop is not None:
                loop.stop()


def _start_tick_driver():
    """Decide who drives reconcile ticks for this server; return the loop it started, if any.

    With a broker (REDIS_URL) Celery beat and workers tick, and new operations are queued to
    them. Without one, HARU_RECONCILE_INTERVAL_MS starts the in-process loop here (with
    --workers > 1 it runs in this parent process, and new operations wait for its next round).
    """

    if settings.HARU["redis_url"]:
        # Only with a broker: importing it creates this process's Celery app from the settings
        # (broker, beat schedule); a server without a broker has no use for one.
        import haru.celery  # noqa: F401, PLC0415

        kick.install(celery_kicker)
        log.info("reconcile ticks: Celery (run `celery -A haru worker` and `celery -A haru beat`)")
        return None
    interval = settings.HARU["reconcile_interval_ms"]
    if not interval:
        log.warning(
            "HARU_RECONCILE_INTERVAL_MS is not set and there is no broker: nothing drives "
            "reconcile ticks, so automatic failover is OFF (POST .../reconcile still works)"
        )
        return None

    return ReconcileLoop(interval_ms=interval, fleets=settings.HARU["reconcile_fleets"]).start()
