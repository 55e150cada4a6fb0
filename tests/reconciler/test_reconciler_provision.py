"""The provisioning pass against a scripted `sky`: launch, retry elsewhere, give up, stop,
replace a failed standby, and never touch static domains."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from fleets.core.credentials import derive_supervisor_token
from fleets.core.states import DomainState
from fleets.drivers.registry import default_registry
from fleets.drivers.sky_cli import SkyCli, subprocess_exec
from fleets.layouts.loader import load_layout
from fleets.models import Domain, Event, Fleet, ModelBinding
from fleets.reconciler.provision import fleet_provision_tick
from fleets.services import provisioning as svc
from fleets.services.layouts import layout_apply
from tests.conftest import EXAMPLE_LAYOUT
from tests.drivers.managed_layout import seed_managed_fleet

TOKEN = "provision-token-0123456789"


@pytest.fixture
def fleet(db, fake_clock, settings):
    settings.HARU = {**settings.HARU, "supervisor_token": TOKEN}
    return seed_managed_fleet()


@pytest.fixture
def run(fleet, fake_sky):
    def one():
        return fleet_provision_tick(
            fleet_id=fleet.id,
            drivers=default_registry(
                sky=lambda: SkyCli(venv=str(fake_sky.venv), environ=fake_sky.environ)
            ),
        )

    return one


def west() -> Domain:
    return Domain.objects.get(slug="west")


def kinds(domain: Domain) -> list[str]:
    return list(
        Event.objects.filter(domain=domain, kind__startswith="domain.").order_by("id")
        .values_list("kind", flat=True)
    )  # fmt: skip


def test_a_new_managed_domain_is_launched_and_gets_its_urls(run, fake_sky):
    assert west().state == DomainState.PROVISIONING
    for _ in range(3):
        run()
    d = west()
    assert d.driver_status["phase"] == "up"
    # https://: the launch shipped the host a TLS identity, whose pin is recorded with the URL.
    assert d.supervisor_url == "https://127.0.0.1:8701"
    assert d.supervisor_fingerprint == d.driver_status["tlsFingerprint"]
    assert d.supervisor_fingerprint.startswith("sha256:") and len(d.supervisor_fingerprint) == 71
    assert d.serving_base_url == "http://127.0.0.1:18001"
    # Bindings the layout left without a URL now point at the cluster's serving endpoint.
    assert ModelBinding.objects.get(domain=d).serving_url == "http://127.0.0.1:18001"
    argv = [c["argv"] for c in fake_sky.calls()]
    assert argv[0] == ["down", "-y", "haru-prov-west"]  # nothing left from an earlier life
    assert argv[1][:5] == ["launch", "-c", "haru-prov-west", "-y", "--async"]
    assert fake_sky.calls()[1]["secrets"] == {
        "HARU_SUPERVISOR_TOKEN": True,
        "HARU_SUPERVISOR_TLS_CERT_PEM": True,
        "HARU_SUPERVISOR_TLS_KEY_PEM": True,
    }
    assert fake_sky.clusters()["haru-prov-west"]["region"] == "us-east-1"
    assert kinds(d) == [
        "domain.provision.replaced",
        "domain.provision.launched",
        "domain.provision.up",
    ]
    # Still provisioning: only the first good heartbeat makes it ready.
    assert d.state == DomainState.PROVISIONING


def test_a_capacity_failure_backs_off_and_tries_the_next_region(run, fake_sky, fake_clock):
    fake_sky.script(
        "launch", {"rc": 1, "output": "ResourcesUnavailableError: no H100 in us-east-1"}
    )
    run()
    run()
    d = west()
    assert d.driver_status["phase"] == "backoff"
    assert d.driver_status["candidate"] == 1
    assert d.driver_status["lastError"]["code"] == "sky_capacity"
    run()  # still backing off: no launch
    assert sum(c["argv"][0] == "launch" for c in fake_sky.calls()) == 1
    fake_clock.advance(seconds=2)
    run()
    run()
    assert fake_sky.clusters()["haru-prov-west"]["region"] == "us-west-2"
    run()
    assert west().driver_status["phase"] == "up"
    assert "domain.provision.launch_failed" in kinds(west())


def test_a_credentials_failure_retries_the_same_place(run, fake_sky):
    fake_sky.script("launch", {"rc": 1, "output": "No cloud is enabled. Run `sky check`."})
    run()
    run()
    d = west()
    assert d.driver_status["candidate"] == 0
    assert d.driver_status["lastError"]["code"] == "sky_no_credentials"


def test_the_domain_fails_with_the_drivers_error_after_the_budget(run, fake_sky, fake_clock):
    fake_sky.script("launch", *[{"rc": 1, "output": "quota exceeded"}] * 5)
    run()
    run()
    fake_clock.advance(seconds=601)
    run()
    d = west()
    assert d.state == DomainState.FAILED
    assert d.driver_status["lastError"]["code"] == "sky_capacity"
    failed = Event.objects.filter(domain=d, kind="domain.failed").get()
    assert failed.data["error"]["code"] == "sky_capacity"
    # Nothing left billing: whatever the launches left is torn down.
    assert fake_sky.calls()[-1]["argv"] == ["down", "-y", "haru-prov-west"]


def test_a_failed_launch_request_is_read_from_its_log(run, fake_sky):
    run()
    run()  # launched
    rid = west().driver_status["requestId"]
    row = {"request_id": rid, "name": "sky.launch", "status": "FAILED"}
    fake_sky.script("api-status", {"rc": 0, "output": json.dumps([row])})
    fake_sky.script("api-logs", {"rc": 0, "output": "InsufficientInstanceCapacity in us-east-1"})
    run()
    d = west()
    assert d.driver_status["phase"] == "backoff"
    assert d.driver_status["lastError"]["code"] == "sky_capacity"
    assert ["api", "logs", rid] in [c["argv"] for c in fake_sky.calls()]


def test_stop_tears_the_cluster_down_and_confirms(run, fake_sky, fleet):
    for _ in range(3):
        run()
    assert svc.domain_stop_request(domain_id=west().id, actor="op")
    assert west().state == DomainState.STOPPING
    run()
    d = west()
    assert d.state == DomainState.STOPPED
    assert d.supervisor_url == ""
    assert "haru-prov-west" not in fake_sky.clusters()
    assert fake_sky.calls()[-2]["argv"] == ["down", "-y", "haru-prov-west"]
    assert kinds(d)[-2:] == ["domain.stopping", "domain.stopped"]
    # And it provisions again from stopped.
    assert svc.domain_provision_begin(domain_id=d.id, actor="op", reason="manual")
    assert west().driver_status["phase"] == "launch"


def test_stop_mode_stop_keeps_the_cluster_stopped(run, fake_sky, fleet):
    Domain.objects.filter(slug="west").update(driver={**west().driver, "stopMode": "stop"})
    for _ in range(3):
        run()
    svc.domain_stop_request(domain_id=west().id, actor="op")
    run()
    assert west().state == DomainState.STOPPED
    assert fake_sky.clusters()["haru-prov-west"]["status"] == "STOPPED"


def test_a_failed_standby_is_replaced_after_the_grace(run, fake_sky, fake_clock, fleet):
    for _ in range(3):
        run()
    Domain.objects.filter(slug="west").update(state=DomainState.FAILED)
    fake_clock.advance(seconds=61)
    Domain.objects.filter(slug="west").update(state_updated_at=fake_clock.now())
    run()
    assert west().state == DomainState.FAILED  # within replaceFailedGraceMs
    fake_clock.advance(seconds=61)
    run()
    d = west()
    assert d.state == DomainState.PROVISIONING
    assert d.driver_status["phase"] == "replace"
    assert d.driver_status["reason"] == "replace_failed_standby"
    assert d.supervisor_url == ""
    run()
    run()
    run()
    assert west().driver_status["phase"] == "up"
    assert fake_sky.clusters()["haru-prov-west"]["launches"] == 1  # down, then a fresh launch


def test_static_domains_are_never_touched(db, fake_clock):
    layout_apply(layout=load_layout(EXAMPLE_LAYOUT))
    fleet = Fleet.objects.get(slug="demo")
    Domain.objects.filter(fleet=fleet).update(state=DomainState.FAILED)

    def no_sky():
        raise AssertionError("sky must not be called for static domains")

    assert fleet_provision_tick(fleet_id=fleet.id, drivers=default_registry(sky=no_sky)).ran
    assert set(Domain.objects.filter(fleet=fleet).values_list("state", flat=True)) == {"failed"}


def test_operators_cannot_stop_the_active_or_provision_a_static_domain(fleet):
    east = Domain.objects.get(slug="east")
    with pytest.raises(svc.ProvisionRefused, match="not provisioned by Haru"):
        svc.domain_provision_begin(domain_id=east.id, actor="op", reason="manual")
    Fleet.objects.filter(pk=fleet.id).update(active_domain=west())
    with pytest.raises(svc.ProvisionRefused, match="active domain"):
        svc.domain_stop_request(domain_id=west().id, actor="op")
    with pytest.raises(svc.ProvisionRefused, match="failed or stopped"):
        svc.domain_provision_begin(domain_id=west().id, actor="op", reason="manual")


def test_no_launch_without_a_supervisor_token(run, fake_sky, settings):
    settings.HARU = {**settings.HARU, "supervisor_token": None}
    run()
    run()
    d = west()
    assert d.driver_status["phase"] == "backoff"
    assert d.driver_status["lastError"]["code"] == "sky_secret_missing"
    assert not [c for c in fake_sky.calls() if c["argv"][0] == "launch"]


def test_a_node_is_launched_with_its_domains_own_token_and_never_the_key(fleet, fake_sky, settings):
    master = "master-key-for-tests-0123456789abcdefghij"
    settings.HARU = {**settings.HARU, "supervisor_master_key": master}
    envs: list[dict[str, str]] = []

    def recording(argv, env, timeout):
        if "launch" in argv:
            envs.append(dict(env))
        return subprocess_exec(argv, env, timeout)

    def sky():
        return SkyCli(venv=str(fake_sky.venv), environ=fake_sky.environ, exec_=recording)

    for _ in range(2):
        fleet_provision_tick(fleet_id=fleet.id, drivers=default_registry(sky=sky))
    (launched,) = envs
    assert launched["HARU_SUPERVISOR_TOKEN"] == derive_supervisor_token(master, west().id)
    assert launched["HARU_SUPERVISOR_TOKEN"] != TOKEN  # not the shared one, though it is set
    assert master not in "".join(launched.values())


SERVE_TABLE = """Services
NAME            VERSION  UPTIME  STATUS  REPLICAS  ENDPOINT
haru-prov-west  1        2m 1s   READY   1/1       34.1.2.3:30001

Service Replicas
SERVICE_NAME    ID  VERSION  ENDPOINT             LAUNCHED    INFRA          RESOURCES   STATUS
haru-prov-west  1   1        http://3.3.3.4:8000  2 mins ago  AWS (us-east-1)  1x(H100:1)  READY
"""


def test_a_skyserve_domain_gets_the_replica_supervisor_and_the_service_endpoint(run, fake_sky):
    d = west()
    Domain.objects.filter(pk=d.id).update(
        provider="skyserve", driver={**d.driver, "servingPort": 8000, "replicas": 1}
    )
    fake_sky.script("serve-down", {"rc": 1, "output": "Service 'haru-prov-west' does not exist."})
    run()
    run()
    argv = [c["argv"] for c in fake_sky.calls()]
    assert argv[1][:6] == ["serve", "up", "-n", "haru-prov-west", "-y", "--async"]
    fake_sky.script(
        "serve-status",
        {"rc": 0, "output": "Services\nNAME VERSION UPTIME STATUS REPLICAS ENDPOINT\n"
         "haru-prov-west 1 - CONTROLLER_INIT 0/1 -"},
    )  # fmt: skip
    run()
    assert west().driver_status["phase"] == "wait"  # not ready yet
    fake_sky.script(
        "serve-status", {"rc": 0, "output": SERVE_TABLE}, {"rc": 0, "output": "34.1.2.3:30001"}
    )
    run()
    d = west()
    assert d.driver_status["phase"] == "up"
    assert d.supervisor_url == "https://3.3.3.4:8701"
    assert d.supervisor_fingerprint == d.driver_status["tlsFingerprint"]
    assert d.serving_base_url == "http://34.1.2.3:30001"


def test_a_lost_launch_is_relaunched(run, fake_sky, fake_clock):
    run()
    # A worker claimed the launch and died before calling sky: no request id, no cluster.
    d = west()
    svc.domain_phase_advance(
        domain=d, to_phase=svc.Phase.WAIT, updates={"launchedAt": "2026-01-01T00:00:00Z"}
    )
    run()
    assert west().driver_status["phase"] == "wait"  # the claimer may still be calling sky
    fake_clock.advance(seconds=121)
    run()
    assert west().driver_status["phase"] == "backoff"
    assert west().driver_status["lastError"]["code"] == "sky_cluster_unknown"


def test_the_reconcile_command_runs_a_provisioning_pass_on_request(fleet, fake_sky, monkeypatch):
    # No HARU_SKY_VENV: the command finds `sky` on PATH, where the scripted one is first.
    for key, value in fake_sky.environ.items():
        monkeypatch.setenv(key, value)
    out = StringIO()
    call_command("reconcile", "--fleet", "prov", "--provision", stdout=out)
    line = json.loads(out.getvalue().strip().splitlines()[-1])
    assert line["provisioned"] == {"ran": True, "busy": True}
    assert fake_sky.calls()[0]["argv"] == ["down", "-y", "haru-prov-west"]
