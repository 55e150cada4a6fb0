"""Drills and the readiness verdict in a real Chromium: the operator sets a short drill schedule
in Django admin, the reconciler runs the drill end to end on the demo's real supervisors, and
the fleet page shows its record and the verdict, live. A drill asked for while an operation is
in flight is refused."""

from __future__ import annotations

import pytest

from tests.browser.conftest import USERNAME, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.e2e]


def _page(browser, portal):
    context = browser.new_context(viewport={"width": 1500, "height": 1000})
    page = context.new_page()
    page.goto(f"{portal.url}/login/")
    page.fill("#id_username", USERNAME)
    page.fill("#id_password", portal.password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{portal.url}/")
    return context, page


def test_a_scheduled_drill_shows_its_record_and_the_readiness_verdict(portal, browser, artifacts):
    context, page = _page(browser, portal)
    try:
        fleet = portal.fleet()
        # The operator sets a one-minute schedule, any time of day, in Django admin.
        page.goto(f"{portal.url}/admin/fleets/fleet/{fleet['id']}/change/")
        page.fill("#id_drill_interval_minutes", "1")
        page.click("input[name=_save]")
        page.wait_for_selector(".messagelist .success", timeout=15000)

        page.goto(f"{portal.url}/fleets/demo/")
        page.wait_for_selector('#live-status[data-state="live"]', timeout=15000)
        assert page.locator("[data-readiness-verdict]").count() == 1
        # The operator picks a mode beside Run drill; the live re-renders below keep it.
        page.select_option('select[name="mode"]', "round_trip")
        # The reconciler loop picks the due drill; the page shows it finish without a reload.
        page.wait_for_selector('[data-drill-state="succeeded"]', timeout=60000)
        steps = page.eval_on_selector_all(
            "[data-drill-step]", "els => els.map(e => e.dataset.drillStep)"
        )
        assert steps == [
            "stop_training", "verify_gpu", "wake", "probe", "sleep", "start_training"
        ]  # fmt: skip
        # Its pass is now one of the verdict's reasons, with its age; routing never moved.
        page.wait_for_selector('[data-reason="drill"][data-reason-status="ok"]', timeout=15000)
        assert page.locator('[data-reason="standby"]').count() == 1
        assert page.get_attribute('[data-domain-slug="east"]', "data-role") == "active"
        assert page.locator('[data-recovery-kind="drill"]').count() == 1
        # Recorded from the serving active by the tick, before the drill's wake was judged.
        assert page.locator("[data-baseline]").count() >= 1
        # The scheduled drill ran in the fleet's mode, and the line says which.
        assert page.get_attribute("[data-drill-mode]", "data-drill-mode") == "check"
        assert page.input_value('select[name="mode"]') == "round_trip"
        page.screenshot(path=str(artifacts / "fleet-drill.png"), full_page=True)
        api = portal.fleet()
        assert api["failoverReadiness"]["verdict"] in ("ready", "at_risk")
        assert api["activeDomainId"] == fleet["activeDomainId"]
    finally:
        context.close()


def test_a_drill_is_refused_while_an_operation_is_in_flight(portal):
    with portal.api() as api:
        wait_for(
            lambda: api.get("/v1/fleets/demo").json()["operation"] is None,
            timeout=60,
            what="nothing in flight",
        )
        # A promotion stops west's trainer first (its grace is seconds): surely in flight.
        promote = api.post("/v1/fleets/demo/promote", json={"targetDomainId": "west"})
        assert promote.status_code == 202, promote.text
        refused = api.post("/v1/fleets/demo/drill", json={})
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "operation_conflict"
        assert error["message"].startswith("no drill while an operation is in flight: promote")
        op_id = promote.json()["operation"]["id"]
        wait_for(
            lambda: api.get(f"/v1/operations/{op_id}").json()["state"] == "succeeded",
            timeout=60,
            what="the promotion",
        )
