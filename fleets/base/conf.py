"""Settings the chat path reads per request, read once per change instead of once per use.

Django's settings object is lazy: each attribute read is a Python call through
`LazyObject.__getattribute__` (about ten times a dictionary lookup), and one chat request read
HARU eight times and ALLOWED_HOSTS once. These return the values themselves, kept until a
settings change replaces them (override_settings and pytest-django's `settings` fixture send
`setting_changed`).

`haru_settings()` is how code reads HARU: the attributes declared once in
fleets/base/setting_table.py (`haru_settings().chat_hold_ms`, typed), each read a dictionary
lookup.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from common.setting import over
from fleets.base.setting_table import HaruSettings


@functools.cache
def haru() -> dict[str, Any]:
    """The HARU settings dictionary (code reads haru_settings())."""
    return settings.HARU


@functools.cache
def haru_settings() -> HaruSettings:
    """The HARU settings as typed attributes. Underneath is the settings dictionary itself, so
    a change made to it in place (a test's monkeypatch.setitem) shows at once."""
    return over(HaruSettings, haru())


@functools.cache
def allowed_hosts() -> list[str]:
    """ALLOWED_HOSTS."""
    return settings.ALLOWED_HOSTS


_READERS: dict[str, tuple[Callable[[], Any], ...]] = {
    "HARU": (haru, haru_settings),
    "ALLOWED_HOSTS": (allowed_hosts,),
}


@receiver(setting_changed)
def _forget(*, setting: str, **kwargs: Any) -> None:
    for reader in _READERS.get(setting, ()):
        reader.cache_clear()  # type: ignore[attr-defined]  # a functools.cache wrapper
