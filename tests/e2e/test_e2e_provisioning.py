"""End to end: a fleet Haru provisions itself heals after losing its active.

The scripted `sky` (tests/drivers/fake_sky.py) "launches" a cluster by running the rendered
task's run command for real: a supervisor with simulated engines and trainer on loopback ports,
with the token delivered as SkyPilot delivers `--secret`. Everything else is Haru: reconcile
ticks and provisioning passes, nothing called by hand between them.
"""

from __future__ import annotations

import os
import time

import pytest

from fleets.core.states import DomainState, InferenceState, TrainingState
from fleets.drivers.registry import default_registry
from fleets.drivers.sky_cli import SkyCli
from fleets.layouts.loader import parse_layout
from fleets.models import Domain, Event, Fleet, Operation, Slot
from fleets.reconciler.provision import fleet_provision_tick
from fleets.reconciler.tick import tick_run
from fleets.services.layouts import layout_apply
from tests.e2e.harness import FAST_POLICY, PYTHON, SimHost

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def managed_domain(host: SimHost, priority: int, region: str) -> dict:
    """The host's domain, provisioned by Haru: no URLs, a driver section instead."""
    domain = host.layout_domain(priority)
    for key in ("supervisorUrl", "servingBaseUrl"):
        domain.pop(key)
    for slot in domain["slots"]:
        for model in slot.get("models", []):
            model.pop("servingUrl")
    config = {k: v for k, v in host.config.items()}
    return {
        **domain,
        "provider": "skypilot",
        "placement": {"cloud": "aws", "region": region, "accelerator": "H100"},
        "driver": {
            "supervisorConfig": config,
            "supervisorCommand": f"{PYTHON} -m supervisor",
            "servingPort": host.model_ports["qwen-small"],
        },
    }


@pytest.fixture
def fleet(db, tmp_path, settings, fake_sky):
    settings.HARU = {**settings.HARU, "supervisor_token": "e2e-provision-token-0123456789"}
    east = SimHost("east", tmp_path)  # only their configs and ports: the fake sky runs them
    west = SimHost("west", tmp_path)
    data = {
        "slug": "healing",
        "activeDomainSlug": "east",
        "policy": {
            **FAST_POLICY,
            "replaceFailedGraceMs": 1000,
            "provisionRetryBackoffMs": 500,
            "provisionTimeoutMs": 60_000,
        },
        "domains": [managed_domain(east, 10, "us-east-1"), managed_domain(west, 20, "us-west-2")],
    }
    layout_apply(layout=parse_layout(data))
    return Fleet.objects.get(slug="healing")


def test_a_provisioned_fleet_loses_its_active_and_heals_by_reconcile_ticks(
    fleet, fake_sky, monkeypatch
):
    monkeypatch.setenv("FAKE_SKY_RUN", "1")
    environ = {**fake_sky.environ, "FAKE_SKY_RUN": "1"}

    def sky() -> SkyCli:
        return SkyCli(venv=str(fake_sky.venv), environ={**_os_environ(), **environ})

    def round_() -> None:
        tick_run(fleet_id=fleet.id, wait_s=5, poll_s=0.3)
        fleet_provision_tick(fleet_id=fleet.id, drivers=default_registry(sky=sky))

    def until(predicate, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            round_()
            value = predicate()
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"not reached within {timeout}s: {what}\n{_state(fleet, fake_sky)}")

    east = lambda: Domain.objects.get(fleet=fleet, slug="east")  # noqa: E731
    west = lambda: Domain.objects.get(fleet=fleet, slug="west")  # noqa: E731

    # 1. Both clusters are launched; east serves, west settles as a sleeping standby that trains.
    until(lambda: standby_posture(west()) and serving(east()), 90, "east serving, west standby")
    assert Fleet.objects.get(pk=fleet.id).active_domain_id == east().id
    first_east = fake_sky.clusters()["haru-healing-east"]["hash"]
    first_pin = _assert_reached_over_pinned_tls(east())

    # 2. East's node dies: its supervisor, engines and trainer are gone.
    fake_sky.kill_node("haru-healing-east")

    # 3. Failover to west, then east is re-provisioned and comes back as the sleeping standby.
    until(lambda: Fleet.objects.get(pk=fleet.id).active_domain_id == west().id, 60, "failover")
    until(lambda: standby_posture(east()) and serving(west()), 120, "east replaced as standby")
    # A new cluster: the old one was torn down first, then launched afresh.
    assert fake_sky.clusters()["haru-healing-east"]["hash"] != first_east
    assert ["down", "-y", "haru-healing-east"] in [c["argv"] for c in fake_sky.calls()]
    # The new cluster got a new identity, pinned in turn.
    assert _assert_reached_over_pinned_tls(east()) != first_pin

    # The events tell the story, in order.
    kinds = list(
        Event.objects.filter(fleet=fleet).order_by("id").values_list("kind", "domain__slug")
    )
    story = [
        # The node's processes are gone (refused everywhere): failed at once, then failed over.
        ("domain.failed", "east"),
        ("operation.auto_failover", "west"),
        ("domain.provisioning", "east"),
        ("domain.provision.replaced", "east"),
        ("domain.provision.launched", "east"),
        ("domain.provision.up", "east"),
        ("domain.ready", "east"),
        ("domain.provision.standby_posture", "east"),
    ]
    cursor = 0
    for step in story:  # each after the one before it
        assert step in kinds[cursor:], (step, kinds[cursor:])
        cursor = kinds.index(step, cursor) + 1
    reprovision = Event.objects.filter(fleet=fleet, kind="domain.provisioning").last()
    assert reprovision.data["reason"] == "replace_failed_active"
    demote = Operation.objects.filter(fleet=fleet, kind="demote", target_domain=east()).last()
    assert demote.state == "succeeded" and demote.reason == "provisioned_standby"


def _assert_reached_over_pinned_tls(domain: Domain) -> str:
    """The provisioned supervisor is called over https:// with the pin its launch shipped (the
    fake node serves HTTPS with the identity handed over as SkyPilot secrets), and no key is in
    the database. Return the pin."""
    pin = domain.supervisor_fingerprint
    assert domain.supervisor_url.startswith("https://127.0.0.1:"), domain.supervisor_url
    assert pin.startswith("sha256:") and pin == domain.driver_status["tlsFingerprint"]
    # Events are ordered newest first.
    launched = Event.objects.filter(domain=domain, kind="domain.provision.launched").first()
    assert launched.data["tlsFingerprint"] == pin
    stored = str(Domain.objects.filter(pk=domain.pk).values().get())
    stored += str(list(Event.objects.filter(domain=domain).values_list("data", flat=True)))
    assert "PRIVATE KEY" not in stored
    return pin


def standby_posture(domain: Domain) -> bool:
    slots = list(Slot.objects.filter(domain=domain))
    return (
        domain.state == DomainState.READY
        and all(s.state == InferenceState.SLEEPING for s in slots if s.kind == "inference")
        and all(s.state == TrainingState.TRAINING for s in slots if s.kind == "training")
    )


def serving(domain: Domain) -> bool:
    slots = Slot.objects.filter(domain=domain, kind="inference")
    return domain.state == DomainState.READY and all(
        s.state == InferenceState.SERVING for s in slots
    )


def _os_environ() -> dict[str, str]:
    return dict(os.environ)


def _state(fleet, fake_sky) -> str:
    rows = [
        f"{d.slug}: {d.state} {d.driver_status} {d.supervisor_url} "
        f"{list(Slot.objects.filter(domain=d).values_list('kind', 'state'))}"
        for d in Domain.objects.filter(fleet=fleet)
    ]
    events = list(Event.objects.filter(fleet=fleet).order_by("id").values_list("kind", flat=True))
    return "\n".join([*rows, f"events: {events[-40:]}", f"clusters: {fake_sky.clusters()}"])
