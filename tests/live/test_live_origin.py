"""Only pages this server served may open the dashboard's WebSocket (issue 11, finding 8).

A staff session's cookie rides along on a handshake from any page; the Origin decides. The
sockets here carry a real staff session, so a refusal can only come from the Origin check.
"""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from fleets.live.origin import origin_allowed

pytestmark = pytest.mark.django_db(transaction=True)


async def _staff_cookie(django_user_model) -> bytes:
    user = await sync_to_async(django_user_model.objects.create_user)(
        "ops", password="pw-1234567", is_staff=True, is_superuser=True
    )
    client = Client()
    await sync_to_async(client.force_login)(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def _connect(cookie: bytes, *, origin: bytes | None, host: bytes = b"haru.example.com"):
    from haru.asgi import application  # noqa: PLC0415 - builds the app (and gc.freeze()s) at import: only once Django is set up for the test

    headers = [(b"host", host), (b"cookie", cookie)]
    if origin is not None:
        headers.append((b"origin", origin))
    comm = WebsocketCommunicator(application, "/ws/overview/", headers=headers)
    connected, _ = await comm.connect()
    if connected:
        await comm.disconnect()
    return connected


@pytest.fixture
def any_host(settings):
    # The token deployment's default: every Host is answered, so only the Origin can refuse.
    settings.ALLOWED_HOSTS = ["*"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://portal.example.com"]


async def test_a_foreign_origin_is_refused_even_with_a_staff_session(
    channel_layer, any_host, django_user_model
):
    cookie = await _staff_cookie(django_user_model)
    assert await _connect(cookie, origin=b"https://haru.example.com")
    assert not await _connect(cookie, origin=b"https://evil.example")
    assert not await _connect(cookie, origin=b"https://haru.example.com.evil.example")
    assert not await _connect(cookie, origin=b"null")
    assert not await _connect(cookie, origin=None)


async def test_a_trusted_origin_may_connect(channel_layer, any_host, django_user_model):
    cookie = await _staff_cookie(django_user_model)
    assert await _connect(cookie, origin=b"https://portal.example.com")


ALLOWED = ["localhost", "127.0.0.1", "[::1]"]


@pytest.mark.parametrize(
    ("origin", "host", "trusted", "expected"),
    [
        ("http://localhost:8700", "localhost:8700", [], True),
        ("http://127.0.0.1:8700", "127.0.0.1:8700", [], True),
        ("http://[::1]:8700", "[::1]:8700", [], True),
        ("HTTP://LOCALHOST:8700", "localhost:8700", [], True),
        # Another port is another origin (another program on the same machine).
        ("http://localhost:9000", "localhost:8700", [], False),
        # A rebound name: the Host itself is not allowed, whatever the Origin says.
        ("http://evil.example:8700", "evil.example:8700", [], False),
        ("https://ops.example", "localhost:8700", ["https://ops.example"], True),
        ("ftp://localhost:8700", "localhost:8700", [], False),
        ("http://localhost:8700", None, [], False),
    ],
)
def test_origin_rule(origin, host, trusted, expected):
    assert origin_allowed(origin, host, allowed_hosts=ALLOWED, trusted_origins=trusted) is expected
