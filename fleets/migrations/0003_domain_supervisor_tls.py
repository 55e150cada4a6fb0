"""Domain.supervisor_transport and supervisor_fingerprint (fleets.core.supervisor_tls).

From now on an http:// supervisor URL beyond loopback is refused unless the domain says
`plain-http` by name. Rows already written with one are marked `plain-http` here, so an
upgrade keeps calling the supervisors it called before (and the next layout apply that leaves
the field out refuses, naming the fix) instead of failing a working fleet over.
"""

import ipaddress
from urllib.parse import urlsplit

from django.db import migrations, models


def _plain_beyond_loopback(url):
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    if parts.scheme.lower() != "http":
        return False
    host = parts.hostname or ""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


def mark_plain_http(apps, schema_editor):
    Domain = apps.get_model("fleets", "Domain")
    plain = [
        pk
        for pk, url in Domain.objects.exclude(supervisor_url="").values_list("pk", "supervisor_url")
        if _plain_beyond_loopback(url)
    ]
    Domain.objects.filter(pk__in=plain).update(supervisor_transport="plain-http")


class Migration(migrations.Migration):

    dependencies = [
        ('fleets', '0002_operation_served_at'),
    ]

    operations = [
        migrations.AddField(
            model_name='domain',
            name='supervisor_fingerprint',
            field=models.CharField(blank=True, default='', max_length=71),
        ),
        migrations.AddField(
            model_name='domain',
            name='supervisor_transport',
            field=models.CharField(
                choices=[('tls', 'tls'), ('plain-http', 'plain-http')],
                default='tls',
                max_length=16,
            ),
        ),
        migrations.RunPython(mark_plain_http, migrations.RunPython.noop),
    ]
