"""The fleet page's script in a real headless Chromium, against a page rendered by this process
(no server, no supervisors): every request the page makes is answered by the test, and its
socket is a Playwright-routed WebSocket the test pushes messages into.

- One live message updates every part of the page it decides, in one pass: two seconds after a
  crash, one frame showed the new active in the header while the in-flight strip still showed
  `probe`, and the crashed host read STANDBY with the hint "promote a standby to move routing".
- The heartbeat age counts up from the last heartbeat, continuously: sampled once a second, an
  age whose period is a little over a second read as a countdown (1.4, 1.2 ... 0.2, then back).
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest

from fleets.base import clock
from fleets.models import Domain, Event, Fleet
from fleets.services.broadcast import fleet_state
from tests.browser.conftest import ROOT
from tests.dashboard.failover_steps import commit_switch, promotion_at_probe

pytestmark = [pytest.mark.browser, pytest.mark.django_db]

BASE = "http://haru.test"
STATIC = ROOT / "haru" / "static" / "haru"


@pytest.fixture(scope="module", autouse=True)
def django_in_playwright():
    # Playwright's sync API keeps its event loop set on this thread; the ORM calls made here
    # between page calls are plain synchronous ones.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture
def staff_html(client, django_user_model):
    staff = django_user_model.objects.create_user(
        "op", password="pw", is_staff=True, is_superuser=True
    )
    client.force_login(staff)

    def get(path: str) -> str:
        response = client.get(path)
        assert response.status_code == 200
        return response.content.decode()

    return get


class FakePortal:
    """Answers the page's requests: the page itself, its static files, the fragment (503 unless
    given: the page then shows what the live messages made of it), the heartbeat poll."""

    def __init__(self, page, html: str, heartbeats=None) -> None:
        self.page, self.html, self.heartbeats = page, html, heartbeats
        self.fragment: str | None = None
        self.sockets: list = []
        page.route(f"{BASE}/**", self._answer)
        page.route_web_socket(re.compile(r".*/ws/fleets/.*"), self._socket)

    def _socket(self, ws) -> None:
        self.sockets.append(ws)  # never connected to a server: the page sees it open

    def _answer(self, route) -> None:
        path = urlsplit(route.request.url).path
        if path.startswith("/static/haru/"):
            name = path.rsplit("/", 1)[1]
            file = STATIC / name
            if not file.exists():
                route.fulfill(status=404)
                return
            kind = "text/css" if name.endswith(".css") else "application/javascript"
            route.fulfill(body=file.read_text(), content_type=kind)
        elif path.endswith("/live/") and path.startswith("/fleets/"):
            if self.fragment is None:
                route.fulfill(status=503, body="busy")
            else:
                route.fulfill(body=self.fragment, content_type="text/html")
        elif path == "/live/heartbeats/":
            body = self.heartbeats() if self.heartbeats else {"generatedAt": None, "domains": {}}
            route.fulfill(body=json.dumps(body), content_type="application/json")
        elif path == "/fleets/demo/":
            route.fulfill(body=self.html, content_type="text/html")
        else:
            route.fulfill(status=404)

    def open(self) -> None:
        self.page.goto(f"{BASE}/fleets/demo/")
        self.page.wait_for_selector('#live-status[data-state="live"]', timeout=10000)

    def push(self, message: dict) -> None:
        assert self.sockets, "the page opened no socket"
        self.sockets[-1].send(json.dumps(message))


# Records, in the page, each batch of mutations (one batch per task that changed the DOM),
# leaving out the ages that tick on their own ten times a second.
RECORD_BATCHES = """
() => {
  window.__batches = [];
  const ticking = (r) => {
    const el = r.target.nodeType === 1 ? r.target : r.target.parentElement;
    return r.type !== "attributes" && el && el.closest("[data-since]") !== null;
  };
  new MutationObserver((records) => {
    const moved = records.filter((r) => !ticking(r));
    if (moved.length) window.__batches.push(moved.length);
  }).observe(document.getElementById("live"),
             { subtree: true, childList: true, attributes: true, characterData: true });
}
"""

VISIBLE = """
(sel) => Array.from(document.querySelectorAll(sel)).filter(
  (el) => el.getClientRects().length > 0).map((el) => el.textContent.trim())
"""


def test_one_live_message_moves_every_part_of_the_page_it_decides_at_once(
    browser, seeded_fleet, staff_html
):
    op, west = promotion_at_probe(seeded_fleet)
    east_id = seeded_fleet.active_domain_id
    html = staff_html("/fleets/demo/")
    # The switch commits; the message is what the commit hook reads (fleets.services.broadcast).
    revision = Fleet.objects.get(pk=seeded_fleet.pk).route_revision
    commit_switch(seeded_fleet, op, west, east_id, revision)
    switched = Event.objects.filter(kind="fleet.route.switched").latest("id")
    message = {
        "type": "fleet.event",
        "fleet": fleet_state(seeded_fleet.id, op.id),
        "event": {"id": switched.id, "kind": switched.kind},
    }
    assert message["fleet"]["operation"]["currentStep"] == "demote_old_sleep"

    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    try:
        portal = FakePortal(page, html)  # the fragment stays unavailable: only the message acts
        portal.open()
        assert page.inner_text("[data-active-slug]") == "east"
        assert "probe" in page.inner_text("[data-in-flight]")
        page.evaluate(RECORD_BATCHES)

        portal.push(message)
        page.wait_for_function(
            "document.querySelector('[data-active-slug]').textContent === 'west'", timeout=5000
        )

        # Every part the message decides changed, in one task (one batch of mutations).
        assert page.evaluate("window.__batches.length") == 1
        assert page.inner_text("[data-route-revision]") == str(revision + 1)
        strip = page.inner_text("[data-in-flight]")
        assert "demote_old_sleep" in strip and "probe" not in strip and "west" in strip
        roles = page.eval_on_selector_all(
            "[data-domain-slug]", "els => els.map(e => [e.dataset.domainSlug, e.dataset.role])"
        )
        assert dict(roles) == {"east": "standby", "west": "active"}
        # A footer written for the other role is not shown: no "promote a standby" on the
        # standby, no Promote button on the active.
        assert page.evaluate(VISIBLE, '[data-domain-slug="east"] [data-serving]') == []
        assert page.evaluate(VISIBLE, '[data-domain-slug="west"] [data-action="promote"]') == []
        steps = dict(
            page.eval_on_selector_all(
                ".op-panel [data-step]",
                "els => els.map(e => [e.dataset.step, e.dataset.stepStatus])",
            )
        )
        assert steps["probe"] == steps["switch_route"] == "done"
        assert steps["demote_old_sleep"] == "running"
        assert steps["demote_old_train"] == "pending"
        assert page.inner_text("[data-operation-step]") == "demote_old_sleep"
    finally:
        page.close()


def test_the_heartbeat_age_counts_up_from_the_last_heartbeat_continuously(
    browser, seeded_fleet, staff_html
):
    east = Domain.objects.get(fleet=seeded_fleet, slug="east")
    Domain.objects.filter(fleet=seeded_fleet).update(last_seen_at=clock.now())
    html = staff_html("/fleets/demo/")
    # The fragment the page re-fetches every 5 s was rendered now: its heartbeat is older than
    # the ones the poll shows by then, and must not take the age back up.
    fragment = staff_html("/fleets/demo/live/")
    period = timedelta(milliseconds=1200)  # a heartbeat a little over the poll's second
    start = datetime.now(UTC)

    def heartbeats() -> dict:
        now = datetime.now(UTC)
        seen = start + period * ((now - start) // period)
        return {
            "generatedAt": clock.iso(now),
            "domains": {str(east.id): {"lastSeenAt": clock.iso(seen), "stale": False}},
        }

    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    try:
        portal = FakePortal(page, html, heartbeats)
        portal.fragment = fragment
        portal.open()
        age = f'[data-hb-domain="{east.id}"] [data-since]'
        # Sample from the first poll's answer on: until then the page ages the heartbeat by the
        # clock of the page it was served, and this page was rendered before the browser opened
        # (seconds before, on a loaded runner), so those first ages read low and the poll's
        # correction would look like the age going up.
        page.wait_for_function(
            f"Date.parse(document.querySelector('{age}').getAttribute('data-since'))"
            f" >= Date.parse('{clock.iso(start)}')"
        )
        samples = []
        until = time.monotonic() + 6.0
        while time.monotonic() < until:
            samples.append(
                page.eval_on_selector(age, "el => [el.getAttribute('data-since'), el.textContent]")
            )
            time.sleep(0.05)
    finally:
        page.close()

    runs: list[list[float]] = []  # the ages shown, per heartbeat the page knew
    last_since = None
    for since, text in samples:
        value = float(text.removesuffix("s"))
        if since != last_since:
            runs.append([])
            last_since = since
        runs[-1].append(value)
    assert len(runs) >= 4, samples
    for shown in runs:
        # Within one heartbeat the age never goes back ...
        assert shown == sorted(shown), samples
    for before, shown in zip(runs, runs[1:-1], strict=False):
        # ... it moves on as time does (tenths of a second), not once a second ...
        assert len(set(shown)) >= 5, samples
        # ... and goes back only for a newer heartbeat, learned within a poll (a second).
        assert shown[0] < before[-1] and shown[0] <= 1.5, samples
