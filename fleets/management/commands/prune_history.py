"""`python manage.py prune_history [--days N] [--dry-run]`: apply event retention now.

Celery beat runs the same every hour (fleets.prune_history); without Celery, run this from
cron. Keeps in-flight operations and each fleet's recent promotions (the failover chart).
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from fleets.base import clock
from fleets.base.conf import haru_settings
from fleets.services.retention import history_prune, retention_cutoff


class Command(BaseCommand):
    help = "Delete events and finished operations older than the retention period."

    def add_arguments(self, parser):
        parser.add_argument(
            "--days",
            type=int,
            default=None,
            help="retention in days (default: HARU_EVENT_RETENTION_DAYS, else 30)",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would go, delete nothing"
        )

    def handle(self, *args, **opts):
        days = opts["days"] if opts["days"] is not None else haru_settings().event_retention_days
        if days < 1:
            raise CommandError("--days must be at least 1")
        cutoff = retention_cutoff(clock.now(), days)
        report = history_prune(older_than=cutoff, dry_run=opts["dry_run"])
        verb = "would delete" if report.dry_run else "deleted"
        self.stdout.write(
            f"{verb} {report.events} event(s) and {report.operations} operation(s) "
            f"older than {days} day(s) (before {cutoff:%Y-%m-%d %H:%M:%S} UTC)"
        )
