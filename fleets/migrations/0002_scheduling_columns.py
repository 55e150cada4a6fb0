"""Scheduling state moves into columns: heartbeat and GPU-read times out of the display blob,
and the no-viable-standby report's rate limit out of each process's memory.

Existing rows are filled from what `last_report` held (`heartbeat.checkedAt`,
`heartbeat.failingSince` while failing, and the later of `gpusAt` and `gpusError.at`), so a
running fleet keeps its edge-triggered events and GPU read spacing across the upgrade.
"""

from datetime import datetime

from django.db import migrations, models


def _time(value):
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def fill_from_reports(apps, schema_editor):
    Domain = apps.get_model("fleets", "Domain")
    for domain in Domain.objects.all().only("id", "last_report"):
        report = domain.last_report if isinstance(domain.last_report, dict) else {}
        heartbeat = report.get("heartbeat") if isinstance(report.get("heartbeat"), dict) else {}
        error = report.get("gpusError") if isinstance(report.get("gpusError"), dict) else {}
        gpu_times = [t for t in (_time(report.get("gpusAt")), _time(error.get("at"))) if t]
        failing = heartbeat.get("ok") is False
        Domain.objects.filter(pk=domain.pk).update(
            heartbeat_checked_at=_time(heartbeat.get("checkedAt")),
            heartbeat_failing_since=(
                _time(heartbeat.get("failingSince")) or _time(heartbeat.get("checkedAt"))
                if failing
                else None
            ),
            gpus_read_at=max(gpu_times, default=None),
        )


class Migration(migrations.Migration):
    dependencies = [
        ("fleets", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="domain",
            name="gpus_read_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="domain",
            name="heartbeat_checked_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="domain",
            name="heartbeat_failing_since",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="fleet",
            name="no_standby_reported_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.RunPython(fill_from_reports, migrations.RunPython.noop),
    ]
