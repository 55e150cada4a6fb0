"""Settings the chat path reads per request, read once per change instead of once per use.

Django's settings object is lazy: each attribute read is a Python call through
`LazyObject.__getattribute__` (about ten times a dictionary lookup), and one chat request read
HARU eight times and ALLOWED_HOSTS once. These return the values themselves, kept until a
settings change replaces them (override_settings and pytest-django's `settings` fixture send
`setting_changed`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver


@functools.cache
def haru() -> dict[str, Any]:
    """The HARU settings dictionary."""
    return settings.HARU


@functools.cache
def allowed_hosts() -> list[str]:
    """ALLOWED_HOSTS."""
    return settings.ALLOWED_HOSTS


_READERS: dict[str, Callable[[], Any]] = {"HARU": haru, "ALLOWED_HOSTS": allowed_hosts}


@receiver(setting_changed)
def _forget(*, setting: str, **kwargs: Any) -> None:
    reader = _READERS.get(setting)
    if reader is not None:
        reader.cache_clear()  # type: ignore[attr-defined]  # a functools.cache wrapper
