"""The `sky` CLI wrapper against a scripted `sky` executable: argv, outputs, every failure."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from common.tls_identity import generate
from fleets.drivers.sky_cli import (
    ExecResult,
    SkyBadOutput,
    SkyCapacity,
    SkyCli,
    SkyCliMissing,
    SkyClusterUnknown,
    SkyCommandFailed,
    SkyNoCredentials,
    SkySecretMissing,
    SkyTimeout,
    parse_serve_table,
)

TOKEN = "tok-0123456789abcdef"
YAML = "name: x\nresources:\n  infra: aws/us-east-1\n  accelerators: H100:1\nrun: |\n  exec true\n"


def cli(fake_sky, **kw) -> SkyCli:
    environ = {**fake_sky.environ, "HARU_SUPERVISOR_TOKEN": "must-not-leak", **kw.pop("env", {})}
    return SkyCli(venv=str(fake_sky.venv), environ=environ, **kw)


def test_launch_is_async_passes_the_secret_by_name_and_returns_the_request_id(fake_sky):
    rid = cli(fake_sky).launch(
        cluster="haru-demo-east", yaml_text=YAML, secrets={"HARU_SUPERVISOR_TOKEN": TOKEN}
    )
    assert len(rid) == 36
    (call,) = fake_sky.calls()
    argv = call["argv"]
    assert argv[:5] == ["launch", "-c", "haru-demo-east", "-y", "--async"]
    assert argv[5:7] == ["--secret", "HARU_SUPERVISOR_TOKEN"]
    assert argv[-1].endswith("haru-demo-east.yaml")
    # The value travelled by environment only: present for sky, never on the command line.
    assert call["secrets"] == {"HARU_SUPERVISOR_TOKEN": True}
    assert TOKEN not in json.dumps(argv)


def test_the_launch_file_is_gone_after_the_call(fake_sky):
    cli(fake_sky).launch(cluster="c1", yaml_text=YAML, secrets={"HARU_SUPERVISOR_TOKEN": TOKEN})
    path = fake_sky.calls()[0]["argv"][-1]
    assert not os.path.exists(path)


def test_haru_variables_and_database_urls_do_not_reach_sky_except_the_named_secret(fake_sky):
    seen = {}

    def exec_(argv, env, timeout):
        seen.update(env)
        return ExecResult(0, "Submitted sky.launch request: abc-123", "")

    environ = {
        "HARU_API_TOKEN": "x",
        "HOME": "/h",
        "DATABASE_URL": "postgres://u:pw@db/haru",
        "REDIS_URL": "redis://:pw@r/0",
        "AWS_PROFILE": "fleet",
    }
    sky = SkyCli(environ=environ, exec_=exec_)
    sky.launch(cluster="c", yaml_text=YAML, secrets={"HARU_SUPERVISOR_TOKEN": TOKEN})
    assert not {"HARU_API_TOKEN", "DATABASE_URL", "REDIS_URL"} & set(seen)
    assert seen["AWS_PROFILE"] == "fleet"
    assert seen["HARU_SUPERVISOR_TOKEN"] == TOKEN
    assert seen["HOME"] == "/h"


def test_serve_up_uses_the_service_name_and_async(fake_sky):
    cli(fake_sky).launch(
        cluster="svc", yaml_text=YAML, secrets={"HARU_SUPERVISOR_TOKEN": TOKEN}, serve=True
    )
    argv = fake_sky.calls()[0]["argv"]
    assert argv[:6] == ["serve", "up", "-n", "svc", "-y", "--async"]


def test_status_reads_the_json_list_with_refresh(fake_sky):
    sky = cli(fake_sky)
    sky.launch(cluster="c1", yaml_text=YAML, secrets={"HARU_SUPERVISOR_TOKEN": TOKEN})
    record = sky.status("c1")
    assert record is not None
    assert (record.status, record.cloud, record.region) == ("UP", "AWS", "us-east-1")
    assert fake_sky.calls()[-1]["argv"] == ["status", "-o", "json", "--refresh", "c1"]


def test_status_of_no_cluster_is_none(fake_sky):
    assert cli(fake_sky).status("nothing") is None


def test_status_skips_hints_printed_before_the_json(fake_sky):
    fake_sky.script(
        "status", {"rc": 0, "output": 'hint: upgrade\n[{"name": "c1", "status": "INIT"}]'}
    )
    assert cli(fake_sky).status("c1").status == "INIT"


def test_status_garbage_is_a_bad_output_error(fake_sky):
    fake_sky.script("status", {"rc": 0, "output": "Clusters\nNAME STATUS"})
    with pytest.raises(SkyBadOutput):
        cli(fake_sky).status("c1")


def test_endpoint_becomes_an_http_url(fake_sky):
    fake_sky.script("endpoint", {"rc": 0, "output": "34.12.5.6:8701"})
    assert cli(fake_sky).endpoint("c1", 8701) == "http://34.12.5.6:8701"
    assert fake_sky.calls()[-1]["argv"] == ["status", "--endpoint", "8701", "c1"]


def test_request_status_and_logs(fake_sky):
    fake_sky.script(
        "api-status",
        {
            "rc": 0,
            "output": json.dumps(
                [{"request_id": "abc-1", "name": "sky.launch", "status": "FAILED"}]
            ),
        },
    )
    sky = cli(fake_sky)
    assert sky.request_status("abc-1") == "FAILED"
    assert fake_sky.calls()[-1]["argv"] == ["api", "status", "-a", "-o", "json", "abc-1"]
    fake_sky.script("api-status", {"rc": 0, "output": "[]"})
    assert sky.request_status("abc-2") is None
    assert "Launching" in sky.request_logs("abc-1")


def test_stop_and_down(fake_sky):
    sky = cli(fake_sky)
    sky.launch(cluster="c1", yaml_text=YAML, secrets={"HARU_SUPERVISOR_TOKEN": TOKEN})
    sky.stop("c1")
    assert sky.status("c1").status == "STOPPED"
    sky.down("c1")
    assert sky.status("c1") is None
    assert [c["argv"][:2] for c in fake_sky.calls()][-4:] == [
        ["stop", "-y"], ["status", "-o"], ["down", "-y"], ["status", "-o"],
    ]  # fmt: skip


def test_down_of_an_unknown_cluster_counts_as_done(fake_sky):
    cli(fake_sky).down("never-launched")


def test_stop_of_an_unknown_cluster_is_cluster_unknown(fake_sky):
    with pytest.raises(SkyClusterUnknown):
        cli(fake_sky).stop("never-launched")


# -- every mapped failure ------------------------------------------------------------------

FAILURES = [
    (
        "sky.exceptions.ResourcesUnavailableError: Failed to provision all possible launchable "
        "resources. Relax the task's resource requirements: 1x AWS(p5.48xlarge)",
        SkyCapacity,
    ),
    (
        "botocore.exceptions.ClientError: VcpuLimitExceeded: You have requested more vCPU "
        "capacity than your current quota",
        SkyCapacity,
    ),
    (
        "ZONE_RESOURCE_POOL_EXHAUSTED: The zone 'us-central1-a' does not have enough resources",
        SkyCapacity,
    ),
    ("No cloud is enabled. Run `sky check` to enable clouds.", SkyNoCredentials),
    ("AWS: disabled. Reason: AWS credentials are not set.", SkyNoCredentials),
    ("Error: HARU_SUPERVISOR_TOKEN is not set in local environment.", SkySecretMissing),
    ("segfault in the launcher", SkyCommandFailed),
]


@pytest.mark.parametrize(("output", "error"), FAILURES)
def test_launch_failures_map_to_driver_errors(fake_sky, output, error):
    fake_sky.script("launch", {"rc": 1, "output": output})
    with pytest.raises(error) as err:
        cli(fake_sky).launch(cluster="c1", yaml_text=YAML, secrets={"HARU_SUPERVISOR_TOKEN": TOKEN})
    assert err.value.retry_elsewhere is (error is SkyCapacity)


def test_a_secret_missing_from_the_environment_is_refused_like_skypilot_does(fake_sky):
    sky = SkyCli(venv=str(fake_sky.venv), environ=fake_sky.environ)
    with pytest.raises(SkySecretMissing):
        # secrets={} but the rendered task still names the secret: sky refuses, as the real one.
        sky._run(
            ["launch", "-c", "c1", "--secret", "HARU_SUPERVISOR_TOKEN", "x.yaml"], what="launch"
        )


def test_error_messages_never_carry_the_secret(fake_sky):
    fake_sky.script("launch", {"rc": 1, "output": f"boom {TOKEN} boom"})
    with pytest.raises(SkyCommandFailed) as err:
        cli(fake_sky).launch(cluster="c1", yaml_text=YAML, secrets={"HARU_SUPERVISOR_TOKEN": TOKEN})
    assert TOKEN not in err.value.message
    assert "<redacted>" in err.value.message


def test_a_missing_cli_is_named(tmp_path):
    with pytest.raises(SkyCliMissing) as err:
        SkyCli(venv=str(tmp_path / "no-venv")).status("c1")
    assert "make sky-env" in err.value.message


def test_a_call_past_its_deadline_is_a_timeout(fake_sky):
    def exec_(argv, env, timeout):
        raise subprocess.TimeoutExpired(argv, timeout)

    with pytest.raises(SkyTimeout):
        SkyCli(exec_=exec_, timeout_s=1).stop("c1")


def test_the_real_exec_enforces_the_deadline(tmp_path):
    venv = tmp_path / "v"
    (venv / "bin").mkdir(parents=True)
    sky = venv / "bin" / "sky"
    sky.write_text("#!/bin/sh\nsleep 5\n")
    sky.chmod(0o755)
    with pytest.raises(SkyTimeout):
        SkyCli(venv=str(venv), timeout_s=0.3).stop("c1")


def test_output_is_bounded(tmp_path):
    venv = tmp_path / "v"
    (venv / "bin").mkdir(parents=True)
    sky = venv / "bin" / "sky"
    sky.write_text("#!/bin/sh\nhead -c 3000000 /dev/zero | tr '\\0' x\nexit 1\n")
    sky.chmod(0o755)
    with pytest.raises(SkyCommandFailed) as err:
        SkyCli(venv=str(venv)).stop("c1")
    assert len(err.value.message) < 1000


# -- SkyServe ------------------------------------------------------------------------------

SERVE_TABLE = """Services
NAME       VERSION  UPTIME  STATUS  REPLICAS  ENDPOINT
haru-svc   1        3m 2s   READY   2/2       34.1.2.3:30001

Service Replicas
SERVICE_NAME  ID  VERSION  ENDPOINT            LAUNCHED     INFRA          RESOURCES         STATUS
haru-svc      2   1        http://3.3.3.3:8000  2 mins ago  AWS (us-east-1)  1x(gpus=H100:1)  READY
haru-svc      1   1        http://3.3.3.4:8000  3 mins ago  AWS (us-east-1)  1x(gpus=H100:1)  READY
"""


def test_serve_table_gives_status_endpoint_and_ready_replicas():
    record = parse_serve_table(SERVE_TABLE, "haru-svc")
    assert record.status == "READY"
    assert record.endpoint == "34.1.2.3:30001"
    assert record.replica_endpoints == ("http://3.3.3.4:8000", "http://3.3.3.3:8000")


def test_serve_table_without_the_service_is_none():
    assert parse_serve_table("No existing services.", "haru-svc") is None


def test_serve_status_endpoint_and_down(fake_sky):
    fake_sky.script(
        "serve-status", {"rc": 0, "output": SERVE_TABLE}, {"rc": 0, "output": "34.1.2.3:30001"}
    )
    sky = cli(fake_sky)
    assert sky.serve_status("haru-svc").status == "READY"
    assert sky.serve_endpoint("haru-svc") == "http://34.1.2.3:30001"
    fake_sky.script("serve-down", {"rc": 1, "output": "Service 'haru-svc' does not exist."})
    sky.serve_down("haru-svc")
    assert [c["argv"] for c in fake_sky.calls()] == [
        ["serve", "status", "haru-svc"],
        ["serve", "status", "--endpoint", "haru-svc"],
        ["serve", "down", "-y", "haru-svc"],
    ]


def test_error_messages_never_carry_a_line_of_the_tls_key(fake_sky):
    key = generate(["c1"]).key_pem.decode()
    line = key.splitlines()[1]  # one base64 line of the key, echoed on its own
    fake_sky.script("launch", {"rc": 1, "output": f"boom {line} boom"})
    secrets = {"HARU_SUPERVISOR_TOKEN": TOKEN, "HARU_SUPERVISOR_TLS_KEY_PEM": key}
    with pytest.raises(SkyCommandFailed) as err:
        cli(fake_sky).launch(cluster="c1", yaml_text=YAML, secrets=secrets)
    assert line not in err.value.message and "<redacted>" in err.value.message
