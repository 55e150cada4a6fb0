"""Login throttling (issue 11, finding 10): after AXES_FAILURE_LIMIT wrong passwords for one
username from one address, that username is locked out from that address, the right password
included, on the dashboard's login page and on the admin's."""

from __future__ import annotations

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.test import Client

pytestmark = pytest.mark.django_db

PASSWORD = "right-pw-1234567"
LOGIN_PAGES = {"dashboard": "/login/", "admin": "/admin/login/"}


@pytest.fixture(autouse=True)
def fast_hasher(settings):
    # Forty password checks at Django's default work factor cost seconds; the rule under test
    # is the count, not the hash.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user(
        "ops", password=PASSWORD, is_staff=True, is_superuser=True
    )


def attempt(client: Client, page: str, password: str, *, address: str = "203.0.113.7"):
    return client.post(
        LOGIN_PAGES[page], {"username": "ops", "password": password}, REMOTE_ADDR=address
    )


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


@pytest.mark.parametrize("page", LOGIN_PAGES)
def test_forty_wrong_passwords_lock_the_username_and_a_right_one_is_refused_too(staff, page):
    limit = settings.AXES_FAILURE_LIMIT
    assert limit == 5  # the documented default (HARU_LOGIN_FAILURE_LIMIT)
    client = Client()
    statuses = [attempt(client, page, f"wrong-{i}").status_code for i in range(40)]
    # The first failures get the login form back; from the limit on, the lockout.
    assert statuses == [200] * (limit - 1) + [429] * (40 - limit + 1)
    locked = attempt(client, page, PASSWORD)
    assert locked.status_code == 429
    assert "Too many failed log-ins" in locked.content.decode()
    assert not logged_in(client)
    # The lock is per username and address: the operator at another address still logs in.
    elsewhere = Client()
    assert attempt(elsewhere, page, PASSWORD, address="198.51.100.9").status_code == 302
    assert logged_in(elsewhere)


def test_a_success_before_the_limit_starts_the_count_again(staff):
    client = Client()
    for i in range(settings.AXES_FAILURE_LIMIT - 1):
        assert attempt(client, "dashboard", f"wrong-{i}").status_code == 200
    assert attempt(client, "dashboard", PASSWORD).status_code == 302
    client.logout()
    assert attempt(client, "dashboard", "wrong-again").status_code == 200
    assert attempt(client, "dashboard", PASSWORD).status_code == 302


def test_the_lock_expires_after_the_cool_off(staff):
    client = Client()
    for i in range(settings.AXES_FAILURE_LIMIT):
        attempt(client, "dashboard", f"wrong-{i}")
    assert attempt(client, "dashboard", PASSWORD).status_code == 429
    # Age the recorded failures past the cool-off instead of sleeping through it.
    AccessAttempt.objects.update(
        attempt_time=AccessAttempt.objects.first().attempt_time - settings.AXES_COOLOFF_TIME
    )
    assert attempt(client, "dashboard", PASSWORD).status_code == 302


def test_behind_tls_the_address_is_the_one_the_proxy_saw(staff, settings):
    # Behind nginx every request comes from loopback; the throttle must not lock the username
    # for everyone, and a client cannot pick its address by sending its own X-Forwarded-For.
    settings.HARU = {**settings.HARU, "behind_tls": True}
    client = Client()
    for i in range(settings.AXES_FAILURE_LIMIT):
        client.post(
            "/login/",
            {"username": "ops", "password": f"wrong-{i}"},
            REMOTE_ADDR="127.0.0.1",
            HTTP_X_FORWARDED_FOR="10.9.9.9, 203.0.113.7",
        )
    forged = client.post(
        "/login/",
        {"username": "ops", "password": PASSWORD},
        REMOTE_ADDR="127.0.0.1",
        HTTP_X_FORWARDED_FOR="203.0.113.7, 10.9.9.9",
    )
    assert forged.status_code == 302  # another client (10.9.9.9 as nginx saw it) logs in
    locked = Client().post(
        "/login/",
        {"username": "ops", "password": PASSWORD},
        REMOTE_ADDR="127.0.0.1",
        HTTP_X_FORWARDED_FOR="203.0.113.7",
    )
    assert locked.status_code == 429
