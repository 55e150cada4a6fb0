"""The `script` driver through the provisioning pass, with real (small) commands: a failing
launch backs off and retries, a launch past its deadline is killed, a describe answering
anything but its schema is refused and changes nothing, the token reaches only the launch's
standard input, and bad settings are refused in the layout's own wording."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from fleets.base.errors import LayoutError
from fleets.core.credentials import derive_supervisor_token
from fleets.core.states import DomainState
from fleets.drivers.script import MAX_DESCRIBE_BYTES
from fleets.layouts.loader import parse_layout
from fleets.models import Domain, Event, Fleet
from fleets.reconciler.provision import fleet_provision_tick
from fleets.services.layouts import layout_apply
from tests.drivers.managed_layout import managed_layout

PY = sys.executable
MASTER = "script-master-key-0123456789abcdefghijkl"
OK = [PY, "-c", "pass"]
STOPPED = [PY, "-c", 'print(\'{"state": "stopped"}\')']


def prints(text: str) -> list[str]:
    return [PY, "-c", f"import sys; sys.stdout.write({text!r})"]


def script_layout(**driver) -> dict:
    layout = managed_layout()
    west = layout["domains"][1]
    west["provider"] = "script"
    west.pop("placement")
    west["driver"] = {"launch": OK, "describe": STOPPED, "stop": OK, **driver}
    return layout


@pytest.fixture
def seed(db, fake_clock, settings):
    settings.HARU = {**settings.HARU, "supervisor_master_key": MASTER}

    def apply(**driver) -> Fleet:
        layout_apply(layout=parse_layout(script_layout(**driver)))
        return Fleet.objects.get(slug="prov")

    return apply


def west() -> Domain:
    return Domain.objects.get(slug="west")


def kinds() -> list[str]:
    return list(
        Event.objects.filter(domain=west(), kind__startswith="domain.provision")
        .order_by("id").values_list("kind", flat=True)
    )  # fmt: skip


def tick(fleet: Fleet, times: int = 1) -> None:
    for _ in range(times):
        assert fleet_provision_tick(fleet_id=fleet.id).ran


def test_a_failing_launch_backs_off_then_launches_again_with_its_events(seed, fake_clock):
    fleet = seed(launch=[PY, "-c", "import sys; print('ipmi: no power'); sys.exit(3)"])
    tick(fleet, 2)  # replace (stop whatever was there), then launch
    status = west().driver_status
    assert status["phase"] == "backoff"
    assert status["launches"] == 1
    error = status["lastError"]
    assert error["code"] == "script_failed"
    assert "exit 3" in error["message"] and "ipmi: no power" in error["message"]
    assert kinds() == ["domain.provision.replaced", "domain.provision.launch_failed"]
    failed = Event.objects.filter(kind="domain.provision.launch_failed").get()
    assert failed.data["code"] == "script_failed" and failed.data["nextCandidate"] == 0

    tick(fleet)  # still inside provisionRetryBackoffMs (1 s): nothing is launched
    assert west().driver_status["launches"] == 1
    fake_clock.advance(seconds=2)
    tick(fleet, 2)  # back to launch, then the second launch fails the same way
    assert west().driver_status["launches"] == 2
    assert west().driver_status["phase"] == "backoff"
    assert kinds().count("domain.provision.launch_failed") == 2
    assert west().state == DomainState.PROVISIONING


def test_a_launch_past_its_deadline_is_killed_and_backs_off(seed, tmp_path):
    pidfile = tmp_path / "launch.pid"
    hang = (
        "import os, time; open(os.environ['PIDFILE'], 'w').write(str(os.getpid())); time.sleep(60)"
    )
    fleet = seed(launch=[PY, "-c", hang], timeouts={"launchS": 1}, envs={"PIDFILE": str(pidfile)})
    tick(fleet)
    began = time.monotonic()
    tick(fleet)
    assert time.monotonic() - began < 10
    status = west().driver_status
    assert status["phase"] == "backoff"
    assert status["lastError"]["code"] == "script_timeout"
    assert "no answer within 1 s" in status["lastError"]["message"]
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed with its process group, and reaped


# Valid but for its size: a message of MAX_DESCRIBE_BYTES characters.
BIG = "import json; "
BIG += f"print(json.dumps({{'state': 'pending', 'message': 'x' * {MAX_DESCRIBE_BYTES}}}))"


@pytest.mark.parametrize(
    ("describe", "rule"),
    [
        (prints("the host is fine, thanks"), "not one JSON object"),
        (prints("[1, 2]"), "must be a JSON object"),
        (prints('{"state": "up"}'), "supervisorUrl: is required when state is up"),
        (prints('{"state": "booting"}'), "state: must be one of pending, up, failed, stopped"),
        (
            prints('{"state": "up", "supervisorUrl": "http://op:pw@10.0.0.7:8701"}'),
            "supervisorUrl: must be an http(s) URL without credentials",
        ),
        (prints('{"state": "pending", "state": "up"}'), "a key is repeated"),
        (prints('{"state": "pending", "extra": 1}'), "extra: unknown field"),
        (prints('{"state": "pending", "n": NaN}'), "NaN is not JSON"),
        ([PY, "-c", BIG], f"printed more than {MAX_DESCRIBE_BYTES} bytes"),
    ],
)
def test_a_describe_answer_outside_its_schema_is_refused_and_changes_nothing(seed, describe, rule):
    fleet = seed(describe=describe)
    tick(fleet, 2)  # replace, launch
    before = Domain.objects.filter(pk=west().pk).values(
        "state", "supervisor_url", "serving_base_url", "last_seen_at"
    )[0]
    events = kinds()
    assert west().driver_status["phase"] == "wait"
    tick(fleet)
    d = west()
    assert d.driver_status["phase"] == "wait"
    error = d.driver_status["lastError"]
    assert error["code"] == "script_bad_output"
    assert error["message"].startswith("describe haru-prov-west: ")
    assert rule in error["message"]
    after = Domain.objects.filter(pk=d.pk).values(
        "state", "supervisor_url", "serving_base_url", "last_seen_at"
    )[0]
    assert after == before and kinds() == events


RECORD = (
    "import json, os, sys; "
    "open(os.path.join(os.environ['OUT'], sys.argv[1]), 'w').write("
    "json.dumps({'env': dict(os.environ), 'stdin': sys.stdin.read(), 'argv': sys.argv}))"
)


def test_the_token_reaches_only_the_launch_command_on_its_standard_input(
    seed, tmp_path, monkeypatch
):
    monkeypatch.setenv("HARU_SUPERVISOR_MASTER_KEY", MASTER)  # in the server's own environment
    monkeypatch.setenv("DATABASE_URL", "postgres://haru:secret@db/haru")
    fleet = seed(
        launch=[PY, "-c", RECORD, "launch"],
        describe=[PY, "-c", RECORD + '; print(\'{"state": "pending"}\')', "describe"],
        stop=[PY, "-c", RECORD, "stop"],
        envs={"OUT": str(tmp_path)},
    )
    tick(fleet, 3)  # replace (stop), launch, describe
    token = derive_supervisor_token(MASTER, west().id)
    calls = {p: json.loads((tmp_path / p).read_text()) for p in ("stop", "launch", "describe")}
    assert calls["launch"]["stdin"] == f"{token}\n"
    assert calls["stop"]["stdin"] == calls["describe"]["stdin"] == ""
    assert calls["stop"]["env"]["HARU_STOP_MODE"] == "down"  # replace removes everything
    launch_id = west().driver_status["requestId"]
    assert calls["launch"]["env"]["HARU_LAUNCH_ID"] == calls["describe"]["env"]["HARU_LAUNCH_ID"]
    assert calls["launch"]["env"]["HARU_LAUNCH_ID"] == launch_id
    inherited = {k for k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR") if k in os.environ}
    haru = {"HARU_FLEET", "HARU_DOMAIN", "HARU_DOMAIN_ID", "HARU_RESOURCE", "HARU_LAUNCH_ID"}
    # LC_CTYPE: Python's own locale coercion in the child, not something the driver passed.
    assert set(calls["launch"]["env"]) - {"LC_CTYPE"} == inherited | haru | {"OUT"}
    assert calls["launch"]["env"]["HARU_RESOURCE"] == "haru-prov-west"
    for call in calls.values():
        seen = json.dumps(call["env"]) + json.dumps(call["argv"])
        assert token not in seen and MASTER not in seen and "secret@db" not in seen
    recorded = json.dumps(list(Event.objects.values_list("data", flat=True)))
    assert token not in recorded and token not in json.dumps(west().driver_status)


def test_the_supervisor_config_goes_to_the_launch_as_inline_json(seed, tmp_path):
    config = managed_layout()["domains"][1]["driver"]["supervisorConfig"]
    fleet = seed(
        launch=[PY, "-c", RECORD, "launch"], envs={"OUT": str(tmp_path)}, supervisorConfig=config
    )
    tick(fleet, 2)
    env = json.loads((tmp_path / "launch").read_text())["env"]
    assert json.loads(env["HARU_SUPERVISOR_CONFIG"]) == config


def test_without_a_master_key_nothing_is_launched(seed, settings, tmp_path):
    fleet = seed(launch=[PY, "-c", RECORD, "launch"], envs={"OUT": str(tmp_path)})
    settings.HARU = {**settings.HARU, "supervisor_master_key": None, "supervisor_token": None}
    tick(fleet, 2)
    assert west().driver_status["lastError"]["code"] == "script_token_missing"
    assert not (tmp_path / "launch").exists()


def test_a_stopping_domain_is_stopped_once_describe_says_so(seed, tmp_path):
    fleet = seed(stop=[PY, "-c", RECORD, "stop"], envs={"OUT": str(tmp_path)})
    Domain.objects.filter(pk=west().pk).update(
        state=DomainState.STOPPING, driver_status={"phase": "teardown"}
    )
    tick(fleet)
    assert west().state == DomainState.STOPPED
    assert json.loads((tmp_path / "stop").read_text())["env"]["HARU_STOP_MODE"] == "down"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"launch": "ipmitool -H 10.0.0.7 power on"},
            "domains[1].driver.launch: must be a list of strings: the program, then its "
            "arguments (no shell)",
        ),
        ({"launch": []}, "domains[1].driver.launch: must name the program to run"),
        (
            {"launch": ["bin/launch-node"]},
            "domains[1].driver.launch[0]: must be an absolute path or a program name on PATH",
        ),
        (
            {"describe": None},
            "domains[1].driver.describe: is required: the launch, describe and stop commands",
        ),
        (
            {"timeouts": {"launchS": 600}},
            "domains[1].driver.timeouts.launchS: must be a whole number of seconds from 1 to 150",
        ),
        (
            {"timeouts": {"bootS": 5}},
            "domains[1].driver.timeouts.bootS: unknown field: the timeouts are launchS, "
            "describeS, stopS",
        ),
        ({"envs": {"HARU_FLEET": "x"}}, "domains[1].driver.envs.HARU_FLEET: is set by Haru itself"),
        (
            {"envs": {"IPMI_PASSWORD": "x"}},
            "domains[1].driver.envs.IPMI_PASSWORD: looks like a credential",
        ),
        ({"shell": "bash"}, "domains[1].driver.shell: unknown field"),
        (
            {"supervisorConfig": {"slots": [], "token": "t"}},
            "domains[1].driver.supervisorConfig: must not carry the supervisor token",
        ),
    ],
)
def test_bad_script_settings_are_refused_in_the_layouts_wording_and_change_nothing(
    seed, change, message
):
    seed()
    before = list(Domain.objects.values("slug", "provider", "driver", "state"))
    layout = script_layout()
    driver = layout["domains"][1]["driver"]
    for key, value in change.items():
        if value is None:
            driver.pop(key)
        else:
            driver[key] = value
    with pytest.raises(LayoutError) as err:
        layout_apply(layout=parse_layout(layout))
    assert any(e.startswith(message) for e in err.value.errors), err.value.errors
    assert list(Domain.objects.values("slug", "provider", "driver", "state")) == before


def test_a_provider_no_driver_is_registered_under_is_refused(db):
    layout = script_layout()
    layout["domains"][1]["provider"] = "ipmi"
    with pytest.raises(LayoutError) as err:
        parse_layout(layout)
    assert "domains[1].provider: must be one of static, script, skypilot, skyserve" in (
        err.value.errors
    )
