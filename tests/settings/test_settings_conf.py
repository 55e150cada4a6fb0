"""fleets.base.conf.haru(): the HARU settings, cached until a settings change replaces them."""

from __future__ import annotations

from django.conf import settings as django_settings
from django.test import override_settings

from fleets.base import conf


def test_haru_is_the_settings_dictionary_and_follows_a_change(settings):
    assert conf.haru() is django_settings.HARU
    settings.HARU = {**settings.HARU, "default_fleet": "changed-by-test"}
    assert conf.haru()["default_fleet"] == "changed-by-test"


def test_the_original_is_seen_again_once_an_override_ends():
    original = conf.haru()
    with override_settings(HARU={**original, "default_fleet": "temporary"}):
        assert conf.haru()["default_fleet"] == "temporary"
    assert conf.haru() is original


def test_allowed_hosts_follow_a_change(settings):
    settings.ALLOWED_HOSTS = ["only.example"]
    assert conf.allowed_hosts() == ["only.example"]
    settings.ALLOWED_HOSTS = ["*"]
    assert conf.allowed_hosts() == ["*"]
