"""What an operator sees must never mislead: live overview, step clocks, retries, postures, and
an admin page that fits a 1440-pixel window. Real server, supervisors, engines and Chromium."""

from __future__ import annotations

import json
from datetime import datetime

import httpx
import pytest

from tests.browser.conftest import ROOT, USERNAME, _manage, free_port, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

# The dashboard re-fetches every 5 s as a safety net; this stops that timer so anything that
# shows up can only have come over the WebSocket.
NO_PERIODIC_REFRESH = """
(() => {
  const original = window.setInterval;
  window.setInterval = function (fn, ms, ...rest) {
    if (ms === 5000) return 0;
    return original.call(window, fn, ms, ...rest);
  };
})();
"""


# A serving inference slot whose model rows say "asleep": the contradiction the dashboard
# showed for about a second after a promotion (the posture came from the last heartbeat).
SERVING_BUT_ASLEEP = """
() => {
  window.__servingButAsleep = [];
  const check = () => {
    document.querySelectorAll('[data-domain-slug="west"] .slots tr').forEach((row) => {
      if (!row.classList.contains("slot-row")) return;
      const serving = row.querySelector(".state-serving");
      let next = row.nextElementSibling;
      while (serving && next && next.classList.contains("model-row")) {
        if (next.querySelector(".posture-asleep")) {
          window.__servingButAsleep.push(next.textContent.trim().slice(0, 60));
        }
        next = next.nextElementSibling;
      }
    });
  };
  new MutationObserver(check).observe(document.body, { subtree: true, childList: true });
  check();
}
"""


def _page(browser, portal, *, width: int = 1440, live_only: bool = False):
    context = browser.new_context(viewport={"width": width, "height": 900})
    if live_only:
        context.add_init_script(NO_PERIODIC_REFRESH)
    page = context.new_page()
    page.goto(f"{portal.url}/login/")
    page.fill("#id_username", USERNAME)
    page.fill("#id_password", portal.password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{portal.url}/")
    return context, page


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def test_the_domain_edit_page_fits_a_1440_pixel_window(portal, browser):
    context, page = _page(browser, portal)
    try:
        east = portal.domain("east")
        page.goto(f"{portal.url}/admin/fleets/domain/{east['id']}/change/")
        page.wait_for_selector("#bindings-group")
        width = page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= 1440, f"the page is {width} px wide"
    finally:
        context.close()


def test_a_new_fleet_appears_on_the_overview_without_a_reload(portal, browser):
    context, page = _page(browser, portal, live_only=True)
    try:
        page.wait_for_selector('#live-status[data-state="live"]', timeout=15000)
        assert page.locator('[data-fleet-slug="later"]').count() == 0
        data = json.loads((ROOT / "examples" / "fleet.two-domain.json").read_text())
        data.update(slug="later", displayName="Added while the page was open")
        data["policy"]["autoFailover"] = False
        for domain in data["domains"]:
            domain["supervisorUrl"] = f"http://127.0.0.1:{free_port()}"
        path = portal.tmp / "later.json"
        path.write_text(json.dumps(data))
        _manage(portal.extra["env"], "seed_layout", "--config", str(path))

        page.wait_for_selector('[data-fleet-slug="later"]', timeout=15000)
    finally:
        context.close()


def test_a_failing_wake_shows_each_retry_the_step_clock_and_then_awake_models(portal, browser):
    context, page = _page(browser, portal)
    west_models = [
        m["port"]
        for slot in portal.extra["configs"]["west"]["slots"]
        for m in slot.get("models", [])
    ]

    def faults(on: bool) -> None:
        for port in west_models:
            httpx.post(
                f"http://127.0.0.1:{port}/_sim/faults", json={"wakeFails": on}, timeout=5
            ).raise_for_status()

    try:
        page.goto(f"{portal.url}/fleets/demo/")
        page.wait_for_selector('#live-status[data-state="live"]', timeout=15000)
        faults(True)
        with portal.api() as api:
            answer = api.post("/v1/fleets/demo/promote", json={"targetDomainId": "west"})
            assert answer.status_code == 202, answer.text
            op_id = answer.json()["operation"]["id"]

            # Every failed attempt is an event on the timeline and the step box says so.
            page.wait_for_selector(
                '[data-event-kind="operation.step.retry"]', state="attached", timeout=20000
            )
            page.wait_for_selector('[data-step="wake"] .step-detail', timeout=10000)
            assert "retry" in page.locator('[data-step="wake"] .step-detail').inner_text()

            # The header's clock counts from the step's start, not the operation's.
            op = api.get(f"/v1/operations/{op_id}").json()
            assert op["currentStep"] == "wake"
            since = page.get_attribute("[data-step-since]", "data-since")
            assert since and _ts(since) == pytest.approx(_ts(op["stepStartedAt"]), abs=0.01)
            assert _ts(since) > _ts(op["startedAt"])

            # From here on, note any moment west shows a serving slot with a model asleep.
            page.evaluate(SERVING_BUT_ASLEEP)
            faults(False)
            wait_for(
                lambda: api.get(f"/v1/operations/{op_id}").json()["state"] == "succeeded",
                timeout=60,
                what="the promotion once wakes work again",
            )
        # The new active's models read awake as soon as it serves, not after a heartbeat.
        page.wait_for_selector('[data-domain-slug="west"][data-role="active"]', timeout=15000)
        page.wait_for_function(
            """() => {
              const card = document.querySelector('[data-domain-slug="west"]');
              return card && card.querySelectorAll('.posture-awake').length >= 2;
            }""",
            timeout=15000,
        )
        assert page.locator('[data-domain-slug="west"] .posture-asleep').count() == 0
        assert page.evaluate("() => window.__servingButAsleep") == []
        # The footer is server-rendered: it follows with the first fragment after the switch.
        page.wait_for_selector('[data-domain-slug="west"] [data-serving="yes"]', timeout=15000)
    finally:
        faults(False)
        context.close()
