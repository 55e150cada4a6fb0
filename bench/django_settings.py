"""Haru's settings with the URLs of the Django-view proxy baseline (bench/django_proxy.py)."""

from haru.settings import *  # noqa: F403 - the same settings, only the URL table differs

ROOT_URLCONF = "bench.django_proxy"
