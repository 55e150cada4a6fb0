from typing import Any

from django.apps import AppConfig
from django.core import checks
from django.db.models.signals import post_migrate

from fleets.base.conf import haru_settings
from fleets.checks import (
    lease_within_hold,
    partly_squashed_schema,
    scoped_tokens,
    shared_supervisor_token,
    weak_secrets,
)


def _seed_beat_schedule(**_kwargs: Any) -> None:
    """After `migrate`: create the periodic tasks beat needs, leaving edited ones alone."""
    from fleets.services.schedule import beat_schedule_seed  # noqa: PLC0415 - app registry

    beat_schedule_seed(reconcile_interval_ms=haru_settings().reconcile_interval_ms)


class FleetsConfig(AppConfig):
    name = "fleets"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Fleets"

    def ready(self) -> None:
        # Registers the OpenAPI auth-scheme extensions with drf-spectacular.
        # In ready(): the extensions import DRF, which needs the app registry.
        from fleets import metrics  # noqa: PLC0415
        from fleets.api import schema  # noqa: F401, PLC0415

        # The /metrics series, from one place: the collectors read models, so after the registry.
        metrics.register()
        checks.register(weak_secrets, checks.Tags.security)
        checks.register(shared_supervisor_token, checks.Tags.security)
        checks.register(scoped_tokens, checks.Tags.security)
        checks.register(partly_squashed_schema, checks.Tags.database)
        checks.register(lease_within_hold)
        post_migrate.connect(_seed_beat_schedule, sender=self, dispatch_uid="haru-beat-schedule")
