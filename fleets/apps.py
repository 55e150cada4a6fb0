from django.apps import AppConfig


class FleetsConfig(AppConfig):
    name = "fleets"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Fleets"

    def ready(self) -> None:
        # Registers the OpenAPI auth-scheme extensions with drf-spectacular.
        # In ready(): the extensions import DRF, which needs the app registry.
        # Registers the GPU plan collector; it reads models, so it waits for the registry.
        from fleets import placement_metrics  # noqa: F401, PLC0415
        from fleets.api import schema  # noqa: F401, PLC0415
