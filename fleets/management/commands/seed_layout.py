"""Seed or re-apply a fleet layout: `python manage.py seed_layout [--config FILE] [--dry-run]`."""

from __future__ import annotations

import json
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from fleets.base.conf import haru_settings
from fleets.base.errors import LayoutError
from fleets.layouts.loader import load_layout
from fleets.services.layouts import layout_apply

DEFAULT_LAYOUT = Path(settings.BASE_DIR) / "examples" / "fleet.two-domain.json"


class Command(BaseCommand):
    help = (
        "Create or update a fleet from a layout file (JSON or YAML), validated and planned first, "
        "then written in batches of HARU_LAYOUT_BATCH_ROWS rows."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--config", help="layout file (default: HARU_FLEET_LAYOUT, else the two-domain example)"
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="validate and report the difference; write nothing",
        )
        parser.add_argument(
            "--prune",
            action="store_true",
            help="delete domains, slots and models that the file no longer names",
        )
        parser.add_argument(
            "--revert-rollout",
            action="store_true",
            help="put the file's profile and servingUrl back in the database over a model a "
            "finished rollout moved (refused otherwise); the hosts are not changed: they keep "
            "serving the rollout's version (docs/rollouts.md, 'Layouts and rollouts')",
        )
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    def handle(self, *args, **opts):
        path = opts["config"] or haru_settings().fleet_layout or DEFAULT_LAYOUT
        try:
            layout = load_layout(
                path,
                max_bytes=haru_settings().layout_max_bytes,
                max_depth=haru_settings().json_max_depth,
                max_rows=haru_settings().layout_max_rows,
            )
            report = layout_apply(
                layout=layout,
                prune=opts["prune"],
                dry_run=opts["dry_run"],
                on_batch=self._progress,
                revert_rollout=opts["revert_rollout"],
            )
        except LayoutError as exc:
            if exc.batches_written:
                raise CommandError(
                    f"layout {path} stopped after {exc.batches_written} batch(es) were written; "
                    "re-apply the file to complete it:\n  " + "\n  ".join(exc.errors)
                ) from None
            raise CommandError(
                f"layout {path} refused, nothing written:\n  " + "\n  ".join(exc.errors)
            ) from None
        if opts["json"]:
            self.stdout.write(
                json.dumps(
                    {"layout": str(path), "fleet": layout.slug, **report.as_dict()}, indent=2
                )
            )
            return
        verb = "would apply" if opts["dry_run"] else "applied"
        self.stdout.write(f"{verb} layout {path} (fleet {layout.slug})")
        for title, items in (
            ("created", report.created),
            ("updated", report.updated),
            ("in the database, not in the file", report.extra),
            ("pruned", report.pruned),
            ("note", report.notes),
        ):
            for item in items:
                self.stdout.write(f"  {title}: {item}")
        self.stdout.write(f"  unchanged: {len(report.unchanged)} row(s)")

    def _progress(self, done: int, total: int) -> None:
        # On stderr so `--json` stays one document; only for layouts big enough to wait for.
        if total > 1:
            self.stderr.write(f"  batch {done}/{total} written")
