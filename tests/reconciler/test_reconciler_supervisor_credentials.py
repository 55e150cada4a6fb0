"""Each domain's supervisor gets its own token (HMAC of the master key and the domain id), the
old shared token keeps working for a migration period with a warning, and a supervisor host
outside HARU_SUPERVISOR_HOSTS is never called."""

from __future__ import annotations

import logging
from collections import defaultdict

import httpx
import pytest
from django.core import checks

from fleets.base import supervisor_tokens
from fleets.checks import shared_supervisor_token
from fleets.core.credentials import derive_supervisor_token
from fleets.models import Domain, Event
from fleets.reconciler.supervisor import client, transport

pytestmark = pytest.mark.django_db

MASTER = "master-key-for-tests-0123456789abcdefghij"
SHARED = "shared-token-for-tests-0123456789abcdefgh"
PORTS = {8701: "east", 8702: "west"}


@pytest.fixture(autouse=True)
def _fresh_warnings():
    supervisor_tokens._warned.cache_clear()
    yield
    supervisor_tokens._warned.cache_clear()


class Seen(defaultdict[str, list[str | None]]):
    """Authorization headers by domain slug; `status` holds those of `/v1/status` alone.

    A tick's GPU memory read runs beside its status call (on another thread, never waited
    for), so the order of all of a host's requests is a race; the status calls' is not.
    """

    def __init__(self) -> None:
        super().__init__(list)
        self.status: defaultdict[str, list[str | None]] = defaultdict(list)


@pytest.fixture
def seen(hosts):
    """Every Authorization header each fake supervisor received, by domain slug."""
    headers = Seen()
    inner = hosts.transport()

    def record(request: httpx.Request) -> httpx.Response:
        slug, header = PORTS[request.url.port], request.headers.get("authorization")
        headers[slug].append(header)
        if request.url.path == "/v1/status":
            headers.status[slug].append(header)
        return inner.handle_request(request)

    previous = transport.use_transport(httpx.MockTransport(record))
    yield headers
    transport.use_transport(previous)


def configure(settings, **values):
    settings.HARU = {
        **settings.HARU,
        "supervisor_token": None,
        "supervisor_master_key": None,
        "supervisor_hosts": (),
        **values,
    }


def own_token(slug: str) -> str:
    return derive_supervisor_token(MASTER, Domain.objects.get(slug=slug).id)


def test_each_supervisor_receives_only_its_own_token(fleet, tick, hosts, seen, settings):
    configure(settings, supervisor_master_key=MASTER)
    east, west = own_token("east"), own_token("west")
    hosts.hosts["east"].token, hosts.hosts["west"].token = east, west
    tick()
    tick()
    assert Domain.objects.get(slug="east").state == "ready"
    assert Domain.objects.get(slug="west").state == "ready"
    assert set(seen["east"]) == {f"Bearer {east}"}
    assert set(seen["west"]) == {f"Bearer {west}"}
    every = " ".join(h or "" for h in seen["east"] + seen["west"])
    assert MASTER not in every
    assert east != west


def test_a_supervisor_holding_another_domains_token_is_refused(fleet, tick, hosts, seen, settings):
    configure(settings, supervisor_master_key=MASTER)
    # West was given east's token: Haru never sends it east's, so west refuses every call.
    hosts.hosts["east"].token = own_token("east")
    hosts.hosts["west"].token = own_token("east")
    tick()
    assert Domain.objects.get(slug="west").last_report["heartbeat"]["ok"] is False
    assert f"Bearer {own_token('east')}" not in seen["west"]


def test_the_shared_token_alone_still_works_and_warns(fleet, tick, hosts, seen, settings, caplog):
    configure(settings, supervisor_token=SHARED)
    hosts.hosts["east"].token = hosts.hosts["west"].token = SHARED
    with caplog.at_level(logging.WARNING, logger="fleets.base.supervisor_tokens"):
        tick()
        tick()
    assert Domain.objects.get(slug="west").last_report["heartbeat"]["ok"] is True
    assert set(seen["east"]) == set(seen["west"]) == {f"Bearer {SHARED}"}
    deprecated = [r for r in caplog.records if "HARU_SUPERVISOR_TOKEN is one token" in r.message]
    assert len(deprecated) == 1  # once per process, not per call
    assert SHARED not in caplog.text
    (warning,) = shared_supervisor_token()
    assert warning.level == checks.WARNING and warning.id == "haru.W002"
    assert SHARED not in warning.msg + (warning.hint or "")


def test_migration_sends_the_shared_token_only_to_a_supervisor_not_yet_migrated(
    fleet, tick, hosts, seen, settings, caplog, standby_due
):
    configure(settings, supervisor_master_key=MASTER, supervisor_token=SHARED)
    hosts.hosts["east"].token = own_token("east")  # migrated
    hosts.hosts["west"].token = SHARED  # not yet
    with caplog.at_level(logging.WARNING, logger="fleets.base.supervisor_tokens"):
        tick()
        standby_due()  # the standby, healthy now, is asked again at its own pace
        tick()
    assert Domain.objects.get(slug="east").last_report["heartbeat"]["ok"] is True
    assert Domain.objects.get(slug="west").last_report["heartbeat"]["ok"] is True
    assert set(seen["east"]) == {f"Bearer {own_token('east')}"}  # never the shared one
    # West refused its own token once, then is sent the shared one first.
    status = seen.status["west"]
    assert status[:2] == [f"Bearer {own_token('west')}", f"Bearer {SHARED}"]
    assert status[2:] and set(status[2:]) == {f"Bearer {SHARED}"}
    assert set(seen["west"]) == {f"Bearer {own_token('west')}", f"Bearer {SHARED}"}
    lagging = [
        r for r in caplog.records if "accepted the shared HARU_SUPERVISOR_TOKEN" in r.message
    ]
    assert len(lagging) == 1 and str(Domain.objects.get(slug="west").id) in lagging[0].message
    assert SHARED not in caplog.text and own_token("west") not in caplog.text
    (warning,) = shared_supervisor_token()
    assert "still set next to HARU_SUPERVISOR_MASTER_KEY" in warning.msg

    # West is given its own token: the next refusal of the shared one switches back for good.
    hosts.hosts["west"].token = own_token("west")
    seen.status["west"].clear()
    standby_due()
    tick()
    standby_due()
    tick()
    status = seen.status["west"]
    assert status[:2] == [f"Bearer {SHARED}", f"Bearer {own_token('west')}"]
    assert set(status[2:]) == {f"Bearer {own_token('west')}"}


def test_a_host_outside_the_allow_list_is_never_called(fleet, tick, hosts, seen, settings):
    configure(settings, supervisor_master_key=MASTER, supervisor_hosts=("127.0.0.1",))
    west = Domain.objects.get(slug="west")
    Domain.objects.filter(pk=west.pk).update(supervisor_url="http://planted.example:8702")
    hosts.hosts["east"].token = own_token("east")
    tick()
    tick()
    assert "west" not in seen  # not one request, so no token ever left for it
    assert seen["east"]
    west.refresh_from_db()
    error = west.last_report["heartbeat"]["error"]
    assert error["kind"] == "refused"
    assert "HARU_SUPERVISOR_HOSTS" in error["message"]
    failed = Event.objects.filter(domain=west, kind="domain.heartbeat.failed")
    assert failed.count() == 1 and failed.get().data["kind"] == "refused"


def test_errors_never_show_url_credentials(settings):
    configure(settings)

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"cannot reach {request.url}", request=request)

    sup = client.SupervisorClient(
        "http://user:hunter2@sup.example:8701",
        token=None,
        http=httpx.Client(transport=httpx.MockTransport(down)),
    )
    result = sup.status(timeout=1.0)
    assert result.error is not None and "sup.example:8701" in result.error.message
    assert "hunter2" not in result.error.message and "user" not in result.error.message


def test_a_stored_url_with_credentials_never_reaches_events_or_reports(fleet, tick, settings):
    configure(settings)
    west = Domain.objects.get(slug="west")
    # A row from before URLs with credentials were refused, pointing at a host that is down.
    Domain.objects.filter(pk=west.pk).update(supervisor_url="http://ops:hunter2@127.0.0.1:8799")
    tick()
    west.refresh_from_db()
    failed = Event.objects.get(domain=west, kind="domain.heartbeat.failed")
    assert "127.0.0.1:8799" in failed.data["message"]
    assert "hunter2" not in str(failed.data) and "hunter2" not in str(west.last_report)
