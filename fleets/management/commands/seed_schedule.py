"""`python manage.py seed_schedule [--reset]`: write Celery beat's periodic tasks.

`migrate` already seeds the missing ones; `--reset` writes the defaults (from
HARU_RECONCILE_INTERVAL_MS) over whatever was edited in admin.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from fleets.base.conf import haru_settings
from fleets.services.schedule import beat_schedule_seed


class Command(BaseCommand):
    help = "Create Haru's periodic tasks for Celery beat (or reset them with --reset)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--reset", action="store_true", help="overwrite edited tasks with the defaults"
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        written = beat_schedule_seed(
            reconcile_interval_ms=haru_settings().reconcile_interval_ms, reset=opts["reset"]
        )
        if written:
            self.stdout.write("wrote: " + ", ".join(written))
        else:
            self.stdout.write("nothing to do (use --reset to overwrite)")
