"""`settings.HARU`, read once per change instead of once per use.

Django's settings object is lazy: each attribute read is a Python call through
`LazyObject.__getattribute__` (about ten times a dictionary lookup). The chat path reads HARU
eight times per request; `haru()` returns the dictionary itself, kept until a settings change
replaces it (override_settings and pytest-django's `settings` fixture send `setting_changed`).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

_haru: dict[str, Any] | None = None


def haru() -> dict[str, Any]:
    """The HARU settings dictionary."""
    global _haru
    if _haru is None:
        _haru = settings.HARU
    return _haru


@receiver(setting_changed)
def _forget(*, setting: str, **kwargs: Any) -> None:
    global _haru
    if setting == "HARU":
        _haru = None
