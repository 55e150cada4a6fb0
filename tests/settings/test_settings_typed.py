"""fleets.base.conf.haru_settings(): the HARU settings as typed attributes over the settings
dictionary itself, cached until a settings change replaces it."""

from __future__ import annotations

from django.conf import settings as django_settings
from django.test import override_settings

from fleets.base import conf
from fleets.base.setting_table import HaruSettings


def test_haru_settings_read_the_settings_dictionary_and_follow_a_change(settings):
    assert conf.haru_settings().__dict__ is django_settings.HARU
    settings.HARU = {**settings.HARU, "default_fleet": "changed-by-test"}
    assert conf.haru_settings().default_fleet == "changed-by-test"


def test_the_original_is_seen_again_once_an_override_ends():
    original = conf.haru_settings()
    with override_settings(HARU={**django_settings.HARU, "default_fleet": "temporary"}):
        assert conf.haru_settings().default_fleet == "temporary"
    assert conf.haru_settings().__dict__ is original.__dict__


def test_a_change_made_in_place_shows_at_once(monkeypatch):
    conf.haru_settings()  # cached before the change
    monkeypatch.setitem(django_settings.HARU, "chat_hold_ms", 1234)
    assert conf.haru_settings().chat_hold_ms == 1234


def test_the_class_attribute_is_the_declaration():
    assert HaruSettings.chat_hold_ms.env == "HARU_CHAT_HOLD_MS"
    assert HaruSettings.chat_hold_ms.key == "chat_hold_ms"
