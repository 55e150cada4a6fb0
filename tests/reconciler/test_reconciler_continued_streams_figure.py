"""How many streams an operation's routing move continued: one figure on the fleet page and in
the API, read from the proxy's counter (`haru_proxy_streams_continued_total`) as it grew from
the operation's routing move to the fleet's next one."""

from __future__ import annotations

import pytest
from django.test import Client
from prometheus_client import Counter

from fleets.base.continuation_series import (
    STREAMS_CONTINUED,
    STREAMS_CONTINUED_LABELS,
    streams_continued_on_this_host,
)
from fleets.models import Event
from fleets.services.operations import operation_request
from tests.reconciler.test_reconciler_flow import run_until_done

pytestmark = pytest.mark.django_db

# The proxy's counter, as the proxy declares it; unregistered, so it never clashes with the
# proxy's own object. Multiprocess mode writes it to this process's file, which the reader sums.
CONTINUED = Counter(STREAMS_CONTINUED, "test twin", list(STREAMS_CONTINUED_LABELS), registry=None)


def continue_streams(n: int, fleet: str = "demo", endpoint: str = "chat") -> None:
    CONTINUED.labels(fleet=fleet, endpoint=endpoint).inc(n)


@pytest.fixture
def staff_client(django_user_model):
    staff = django_user_model.objects.create_user(
        "ops", password="pw-ops-1234", is_staff=True, is_superuser=True
    )
    client = Client()
    client.force_login(staff)
    return client


def promote(fleet, tick, domains, fake_clock, slug: str):
    operation_request(fleet=fleet, kind="promote", target_domain_id=domains()[slug].id)
    op = run_until_done(tick, clock=fake_clock, step_ms=1000)
    assert op is not None and op.state == "succeeded", op.error
    return op


def api_figure(client, op) -> int | None:
    answer = client.get(f"/v1/operations/{op.id}")
    assert answer.status_code == 200
    return answer.json()["streamsContinued"]


def page_text(staff_client) -> str:
    answer = staff_client.get("/fleets/demo/live/")
    assert answer.status_code == 200
    return answer.content.decode()


def test_the_reader_sums_every_endpoint_of_one_fleet():
    before = streams_continued_on_this_host("demo")
    other = streams_continued_on_this_host("another-fleet")
    continue_streams(2, endpoint="chat")
    continue_streams(3, endpoint="completions")
    continue_streams(7, fleet="another-fleet")
    assert streams_continued_on_this_host("demo") == before + 5
    assert streams_continued_on_this_host("another-fleet") == other + 7


def test_streams_continued_after_the_routing_move_are_the_operations_figure_everywhere(
    fleet, tick, hosts, domains, fake_clock, client, staff_client
):
    tick()
    continue_streams(4)  # before the move: another cause, not this operation's
    op = promote(fleet, tick, domains, fake_clock, "west")
    switched = Event.objects.get(operation=op, kind="operation.step.done", step="switch_route")
    assert switched.data["streamsContinuedAtSwitch"] == streams_continued_on_this_host("demo")
    assert api_figure(client, op) == 0
    assert "0 streams continued on west" in page_text(staff_client)

    continue_streams(2, endpoint="chat")
    continue_streams(1, endpoint="completions")
    continue_streams(9, fleet="another-fleet")  # another fleet's streams are not ours
    assert api_figure(client, op) == 3
    listed = client.get("/v1/fleets/demo/operations").json()["operations"]
    assert [o["streamsContinued"] for o in listed if o["id"] == str(op.id)] == [3]
    text = page_text(staff_client)
    assert 'data-operation-streams-continued="3"' in text
    assert "3 streams continued on west" in text and "since routing moved" in text


def test_the_next_routing_move_closes_an_operations_window(
    fleet, tick, hosts, domains, fake_clock, client
):
    tick()
    first = promote(fleet, tick, domains, fake_clock, "west")
    continue_streams(2)
    second = promote(fleet, tick, domains, fake_clock, "east")
    continue_streams(5)
    assert api_figure(client, first) == 2  # stays what it was when routing moved again
    assert api_figure(client, second) == 5


def test_a_count_that_went_back_reads_as_unknown(
    fleet, tick, hosts, domains, fake_clock, client, staff_client
):
    # A proxy process that restarted loses its counts: what grew since cannot be said.
    tick()
    op = promote(fleet, tick, domains, fake_clock, "west")
    switched = Event.objects.get(operation=op, kind="operation.step.done", step="switch_route")
    ahead = streams_continued_on_this_host("demo") + 10
    Event.objects.filter(pk=switched.pk).update(
        data={**switched.data, "streamsContinuedAtSwitch": ahead}
    )
    assert api_figure(client, op) is None
    assert "streams continued: unknown" in page_text(staff_client)


def test_an_operation_that_never_moved_routing_has_no_figure(fleet, tick, domains, client):
    tick()
    west = domains()["west"]
    op = operation_request(fleet=fleet, kind="drill", target_domain_id=west.id).operation
    continue_streams(3)
    assert api_figure(client, op) is None
