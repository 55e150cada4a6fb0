# Per-fleet access (docs/access.md): the operate and administer roles as Fleet permissions,
# and API tokens scoped to fleets. Numbered 0004: 0003 is another change landing beside it.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("fleets", "0003_domain_supervisor_tls"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="fleet",
            options={
                "ordering": ["slug"],
                "permissions": [
                    (
                        "operate_fleet",
                        "Can operate the fleet (promote, demote, drill, cancel, ...)",
                    ),
                    ("administer_fleet", "Can administer the fleet (layout, deletion, access)"),
                ],
            },
        ),
        migrations.CreateModel(
            name="ApiToken",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=100, unique=True)),
                ("prefix", models.CharField(editable=False, max_length=16)),
                ("secret_sha256", models.CharField(editable=False, max_length=64, unique=True)),
                (
                    "scope",
                    models.CharField(
                        choices=[("read", "read"), ("operate", "operate")],
                        default="read",
                        max_length=16,
                    ),
                ),
                (
                    "all_fleets",
                    models.BooleanField(
                        default=False,
                        help_text="Every fleet, present and future; otherwise only those chosen.",
                    ),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("last_used_at", models.DateTimeField(blank=True, editable=False, null=True)),
                ("revoked_at", models.DateTimeField(blank=True, null=True)),
                (
                    "created_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "fleets",
                    models.ManyToManyField(
                        blank=True, related_name="api_tokens", to="fleets.fleet"
                    ),
                ),
            ],
            options={
                "ordering": ["name"],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("scope__in", ["read", "operate"])),
                        name="apitoken_scope_valid",
                    )
                ],
            },
        ),
    ]
