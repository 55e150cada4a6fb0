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

from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from common.setting import over
from fleets.base.setting_table import HaruSettings

_cached: dict[str, Any] = {}
TYPED = "HARU as attributes"  # haru_settings()'s entry, forgotten with HARU's


def haru_settings() -> HaruSettings:
    """The HARU settings as typed attributes. Underneath is the settings dictionary itself, so
    a change made to it in place (a test's monkeypatch.setitem) shows at once."""
    try:
        return _cached[TYPED]
    except KeyError:
        value = _cached[TYPED] = over(HaruSettings, haru())
        return value


def haru() -> dict[str, Any]:
    """The HARU settings dictionary (code reads haru_settings())."""
    try:
        return _cached["HARU"]
    except KeyError:
        value = _cached["HARU"] = settings.HARU
        return value


def allowed_hosts() -> list[str]:
    """ALLOWED_HOSTS."""
    try:
        return _cached["ALLOWED_HOSTS"]
    except KeyError:
        value = _cached["ALLOWED_HOSTS"] = settings.ALLOWED_HOSTS
        return value


@receiver(setting_changed)
def _forget(*, setting: str, **kwargs: Any) -> None:
    _cached.pop(setting, None)
    if setting == "HARU":
        _cached.pop(TYPED, None)
