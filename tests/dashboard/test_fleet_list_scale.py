"""The operator at many fleets (issue 27): the overview, the API's fleet list, the admin's,
/metrics and one fleet's live page read in a number of statements that does not grow with the
number of fleets; search, the status filters and pages find exactly the fleets they name, the
same as the one-fleet reads judge them; and every list still shows only what a user may view.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from bench.fleet_population import populate, trouble
from fleets.base import clock
from fleets.core.access import Role
from fleets.core.readiness import ReadinessVerdict
from fleets.core.report import DomainReport, HeartbeatNote, ReadError
from fleets.dashboard.selectors import OVERVIEW_PAGE_SIZE, overview_rows
from fleets.models import Domain, Fleet
from fleets.reads.fleet_health import fleet_health, heartbeat_errors
from fleets.reads.fleet_list import fleet_rows, readinesses
from fleets.reads.readiness import fleet_readiness
from fleets.reads.recovery import recovery_samples, recovery_samples_of
from fleets.reads.selectors import failover_damping_state, fleet_view, operation_in_flight
from fleets.services.access import fleet_role_set

pytestmark = pytest.mark.django_db


@pytest.fixture
def superuser(django_user_model) -> Client:
    user = django_user_model.objects.create_superuser("chief", password="pw-0123456789")
    client = Client()
    client.force_login(user)
    return client


# Every read whose statements must not grow with the fleets (the fleet pages name `few-0003`,
# a fleet of the first population, whatever was added after it).
READS = (
    "/",
    "/live/overview/",
    "/?status=unhealthy",
    "/?status=not_ready&q=few",
    "/?status=in_operation",
    "/live/heartbeats/?fleets=few-0001,few-0002",
    "/fleets/few-0003/",
    "/fleets/few-0003/live/",
    "/live/heartbeats/?fleet=few-0003",
    "/v1/fleets",
    "/v1/fleets?status=unhealthy",
    "/v1/fleets?status=not_ready&q=few",
    "/v1/fleets?status=in_operation",
    "/admin/fleets/fleet/",
    "/admin/fleets/fleet/?status=unhealthy",
    "/metrics",
)


def _statements(client: Client, path: str) -> int:
    client.get(path)  # warm: caches of content types, sessions, the template loader
    with CaptureQueriesContext(connection) as queries:
        response = client.get(path)
    assert response.status_code == 200, (path, response.status_code)
    return len(queries)


def test_no_read_runs_more_statements_for_more_fleets(superuser):
    populate(4, prefix="few")
    before = {path: _statements(superuser, path) for path in READS}
    populate(40, prefix="many")
    after = {path: _statements(superuser, path) for path in READS}
    assert after == before


def _judged_one_by_one(now) -> dict[str, set[str]]:
    """What the one-fleet reads say of every fleet: the reference the lists must agree with."""
    out: dict[str, set[str]] = {"unhealthy": set(), "not_ready": set(), "in_operation": set()}
    for fleet in Fleet.objects.all():
        view = fleet_view(fleet)
        domains = list(Domain.objects.filter(fleet=fleet))
        damping = failover_damping_state(fleet.id, view.policy, now)
        if fleet_health(view, now, heartbeat_errors(domains), damping)[0] != "ok":
            out["unhealthy"].add(fleet.slug)
        if fleet_readiness(fleet, now=now).verdict == ReadinessVerdict.NOT_READY:
            out["not_ready"].add(fleet.slug)
        if operation_in_flight(fleet.id) is not None:
            out["in_operation"].add(fleet.slug)
    return out


def _api_slugs(client: Client, query: str) -> set[str]:
    body = client.get(f"/v1/fleets?limit=1000&{query}").json()
    assert body["count"] == len(body["fleets"])
    return {f["slug"] for f in body["fleets"]}


def test_each_status_filter_finds_the_fleets_the_one_fleet_reads_judge(superuser, settings):
    fleets = populate(30)
    reference = _judged_one_by_one(clock.now())
    seeded = {
        name: {f.slug for i, f in enumerate(fleets) if trouble(i)[key]}
        for name, key in (
            ("unhealthy", "active_failed"),
            ("not_ready", "standby_failed"),
            ("in_operation", "in_operation"),
        )
    }
    for status, expected in reference.items():
        # The seeded trouble is found (a failed standby also leaves the fleet amber, so the
        # unhealthy set holds more than the failed actives), and nothing else is.
        assert seeded[status] <= expected
        assert expected < {f.slug for f in fleets}  # and the healthy are left out
        assert _api_slugs(superuser, f"status={status}") == expected
        html = superuser.get(f"/?status={status}").content.decode()
        shown = {f.slug for f in fleets if f'data-fleet-slug="{f.slug}"' in html}
        assert shown == expected
        admin = superuser.get(f"/admin/fleets/fleet/?status={status}").content.decode()
        assert {f.slug for f in fleets if f">{f.slug}</a>" in admin} == expected


def test_the_batched_readiness_and_recovery_reads_equal_the_one_fleet_reads():
    fleets = populate(12)
    now = clock.now()
    batched = readinesses(fleet_rows(fleets), now)
    samples = recovery_samples_of(fleets)
    for index, fleet in enumerate(fleets):
        assert batched[fleet.pk] == fleet_readiness(fleet, now=now)
        assert samples[fleet.pk] == recovery_samples(fleet)
        # Every third has a drill in its history: the comparison compares something.
        assert bool(samples[fleet.pk]) == (index % 3 == 0)


def test_search_matches_slug_or_name_in_any_case(superuser):
    populate(12)
    assert _api_slugs(superuser, "q=SCALE-001") == {f"scale-{i:04d}" for i in range(10, 12)}
    assert _api_slugs(superuser, "q=fleet 7") == {"scale-0007"}
    html = superuser.get("/?q=scale-0011").content.decode()
    assert 'data-fleet-slug="scale-0011"' in html and 'data-fleet-slug="scale-0010"' not in html


def test_the_api_pages_cover_every_fleet_once_in_slug_order(superuser):
    fleets = populate(23)
    seen, url = [], "/v1/fleets?limit=10"
    while url:
        body = superuser.get(url).json()
        assert body["count"] == 23 and len(body["fleets"]) <= 10
        seen += [f["slug"] for f in body["fleets"]]
        url = body["next"]
    assert seen == [f.slug for f in fleets]
    last = superuser.get("/v1/fleets?limit=10&offset=20").json()
    assert last["next"] is None and last["previous"].endswith("limit=10&offset=10")


def test_the_api_list_defaults_to_one_bounded_page(superuser):
    populate(3)
    body = superuser.get("/v1/fleets").json()
    assert (body["limit"], body["offset"], body["count"]) == (100, 0, 3)
    assert superuser.get("/v1/fleets?limit=5000").json()["limit"] == 1000


@pytest.mark.parametrize(
    "query",
    ["status=broken", "limit=ten", "offset=-1", "limit=1e3"],
)
def test_a_bad_list_parameter_is_a_clear_400(superuser, query):
    populate(2)
    response = superuser.get(f"/v1/fleets?{query}")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"


def test_the_overview_pages_keep_the_search_and_filter(superuser):
    populate(OVERVIEW_PAGE_SIZE + 5)
    first = superuser.get("/?q=scale").content.decode()
    assert first.count("data-fleet-slug=") == OVERVIEW_PAGE_SIZE
    assert "?q=scale&amp;page=2" in first
    second = superuser.get("/?q=scale&page=2").content.decode()
    assert second.count("data-fleet-slug=") == 5
    assert 'data-fleet-slug="scale-0054"' in second
    # The live fragment re-fetches the page shown, not the first one.
    assert 'data-live-url="/live/overview/?q=scale&amp;page=2"' in second


def test_an_unknown_overview_filter_shows_everything_and_says_why(superuser):
    populate(3)
    html = superuser.get("/?status=sideways").content.decode()
    assert "unknown status filter" in html and html.count("data-fleet-slug=") == 3


def test_every_list_and_filter_shows_only_the_fleets_a_user_may_view(django_user_model, api_token):
    # With an operator token configured the API is no longer open: a portal session reads it
    # with its user's roles.
    fleets = populate(20)
    user = django_user_model.objects.create_user("watcher", password="pw-0123456789")
    mine = {fleets[1], fleets[2], fleets[5]}  # unhealthy, not ready, healthy
    for fleet in mine:
        fleet_role_set(holder=user, role=Role.VIEW, fleet=fleet)
    client = Client()
    client.force_login(user)
    slugs = {f.slug for f in mine}
    assert _api_slugs(client, "") == slugs
    assert _api_slugs(client, "status=unhealthy") <= slugs
    assert _api_slugs(client, "status=unhealthy")  # and finds its own trouble
    for page in ("/", "/?status=unhealthy", "/?q=scale", "/live/overview/"):
        html = client.get(page).content.decode()
        shown = {f.slug for f in fleets if f'data-fleet-slug="{f.slug}"' in html}
        assert shown and shown <= slugs, page
    # The overview's heartbeat poll names fleets; one the user may not view is left out.
    named = ",".join(f.slug for f in fleets[:6])
    domains = client.get(f"/live/heartbeats/?fleets={named}").json()["domains"]
    assert set(domains) == {str(d.id) for d in Domain.objects.filter(fleet__in=mine)}


def test_the_overview_poll_reads_the_fleets_of_its_page_only(superuser):
    fleets = populate(6)
    domains = superuser.get(f"/live/heartbeats/?fleets={fleets[4].slug}").json()["domains"]
    assert set(domains) == {str(d.id) for d in Domain.objects.filter(fleet=fleets[4])}
    html = superuser.get("/?q=scale-0004").content.decode()
    assert 'data-page-fleets="scale-0004"' in html


def test_a_failing_heartbeat_read_from_the_note_alone_judges_as_the_whole_report(superuser):
    fleets = populate(3)
    now = clock.now()
    report = DomainReport(
        gpus_at=now,
        heartbeat=HeartbeatNote(
            ok=False,
            checked_at=now,
            failing_since=now,
            error=ReadError(kind="connect", message="connection refused by 10.0.0.1"),
        ),
    ).to_json()
    Domain.objects.filter(pk=fleets[0].active_domain_id).update(last_report=report)
    full = fleet_health(
        fleet_view(fleets[0]),
        now,
        heartbeat_errors(Domain.objects.filter(fleet=fleets[0])),
        None,
    )
    assert full[0] == "bad" and "connection refused by 10.0.0.1" in full[1][0]
    row = next(r for r in overview_rows(now=now, fleets=fleets) if r["slug"] == fleets[0].slug)
    assert (row["health"], row["health_reasons"]) == full
    # The first was healthy before its heartbeat failed; the others are seeded in trouble.
    assert _api_slugs(superuser, "status=unhealthy") == {f.slug for f in fleets}
