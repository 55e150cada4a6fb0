"""deploy/README.md's walkthrough, followed on this machine as far as it allows.

The blocks marked `<!-- rehearsed -->` (the supervisors' CA, the environment file with its
generated secrets, the schema and the layout, each GPU host's config, token and certificate) run
verbatim in one bash, with three stand-ins: /etc/haru is a temporary directory, `haru_admin` is
this checkout's manage.py with the same environment file (not `runuser` into an installed venv),
and the database is the embedded SQLite (no PostgreSQL, no Redis). Then gpu-a's supervisor starts
from the files rendered for it, as the GPU host would start it, except that its GPU and engine are
simulated (no NVML, no vLLM here): it must answer over HTTPS, with a certificate the control
plane's CA bundle verifies for gpu-a.internal, to gpu-a's token and to nothing else; and the
control plane's own client, configured by the walkthrough's environment file, must reach it.

Every `manage.py` command and flag both READMEs name is checked against Django's own parser.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import get_commands, load_command_class

from common.ports import free_port
from tests.deploy.real_tools import require

ROOT = Path(__file__).resolve().parents[2]
READMES = [ROOT / "deploy" / "README.md", ROOT / "deploy" / "README.ja.md"]
FENCE = re.compile(r"(<!-- rehearsed -->\n)?```sh\n(.*?)```", re.S)
ADMIN = re.compile(r"\b(?:haru_admin|django-admin|manage\.py)\s+(.*)")
SHELL_END = re.compile(r"\s*(?:[|;>)]|&&|\s#\s).*", re.S)
FLEET = "gpu-pair"
HOSTS = ("gpu-a", "gpu-b")
SECRETS = ("HARU_API_TOKEN", "HARU_SUPERVISOR_MASTER_KEY", "HARU_SECRET_KEY")


def _blocks(path: Path) -> list[tuple[bool, str]]:
    """(rehearsed, text) of every ```sh block."""
    return [(bool(m.group(1)), m.group(2)) for m in FENCE.finditer(path.read_text())]


def _admin_calls(path: Path) -> list[list[str]]:
    """The arguments of every manage.py (or haru_admin, django-admin) call in the sh blocks."""
    calls = []
    for _, block in _blocks(path):
        for line in block.replace("\\\n", " ").splitlines():
            if line.lstrip().startswith("haru_admin()"):
                continue
            for match in ADMIN.finditer(line):
                words = shlex.split(SHELL_END.sub("", match.group(1).replace('"$@"', "")))
                if words:
                    # A shell variable stands for a value this page chooses: any will do here.
                    calls.append([w if "$" not in w else "x" for w in words])
    return calls


def test_the_walkthrough_names_the_commands_it_relies_on():
    named = {call[0] for call in _admin_calls(READMES[0])}
    assert {"migrate", "seed_layout", "supervisor_config", "supervisor_token"} <= named


@pytest.mark.parametrize("readme", READMES, ids=lambda p: p.name)
def test_every_manage_py_command_and_flag_the_readme_names_exists(readme):
    commands = get_commands()
    wrong = []
    for name, *args in _admin_calls(readme):
        if name not in commands:
            wrong.append(f"no command {name!r}")
            continue
        parser = load_command_class(commands[name], name).create_parser("django-admin", name)
        try:
            parser.parse_args(args)
        except SystemExit:
            wrong.append(f"{name} {' '.join(args)}: refused by its parser")
    assert wrong == []


def test_both_readmes_rehearse_the_same_commands():
    """The Japanese page's rehearsed blocks are the English ones (their comments aside)."""
    english, japanese = (
        [re.sub(r"[ \t]+# .*", "", b) for r, b in _blocks(p) if r] for p in READMES
    )
    assert english and japanese == english


def _prelude(tmp_path: Path) -> str:
    etc = tmp_path / "etc" / "haru"
    return f"""set -euo pipefail
DB_PASSWORD=rehearsal
haru_admin() {{
  env -u DATABASE_URL -u REDIS_URL \\
    $(grep -v -e '^#' -e '^DATABASE_URL=' -e '^REDIS_URL=' {etc}/haru.env | xargs) \\
    DJANGO_SETTINGS_MODULE=haru.settings HARU_VAR_DIR={tmp_path}/var \\
    {sys.executable} {ROOT}/manage.py "$@"
}}
"""


def _rehearsal(tmp_path: Path) -> str:
    blocks = [b for rehearsed, b in _blocks(READMES[0]) if rehearsed]
    assert len(blocks) >= 4, "the README's rehearsed blocks are missing"
    return _prelude(tmp_path) + "\n".join(blocks).replace(
        "/etc/haru", str(tmp_path / "etc" / "haru")
    )


def _env_file(path: Path) -> dict[str, str]:
    return dict(
        line.split("=", 1)
        for line in path.read_text().splitlines()
        if line and not line.startswith("#")
    )


def _simulated(config: dict, sim_state: Path, serving_port: int) -> dict:
    """The rendered config with what this machine lacks simulated: NVML and vLLM."""
    planned = config["plan"]["gpus"][0]
    config["gpu"] = {
        "backend": "sim",
        "simStateFile": str(sim_state),
        "simGpus": [{"index": 0, "totalMiB": planned["memoryMiB"], "name": "NVIDIA H100 80GB"}],
    }
    for slot in config["slots"]:
        for model in slot.get("models", []):
            model["port"] = serving_port
            profile = model["profile"]
            model["profile"] = {
                "engine": "sim",
                "gpus": profile["gpus"],
                "gpuMemoryUtilization": profile["gpuMemoryUtilization"],
                "extraArgs": ["--weights-mib", "1024", "--wake-latency-ms", "10"],
            }
    return config


# The control plane's own client, in the rehearsal's database and environment (its CA bundle,
# master key, allow-list), calling gpu-a's supervisor as a heartbeat does. The one stand-in:
# gpu-a.internal:8701 resolves to the supervisor started here, as DNS would resolve it there.
CONTROL_PLANE_CALL = """
import json, os, socket
resolve = socket.getaddrinfo
def as_dns_would(host, port, *args, **kwargs):
    if host == "gpu-a.internal" and int(port) == 8701:
        return resolve("127.0.0.1", int(os.environ["SUPERVISOR_PORT"]), *args, **kwargs)
    return resolve(host, port, *args, **kwargs)
socket.getaddrinfo = as_dns_would
from fleets.models import Domain
from fleets.reconciler.supervisor.client import client_for
call = client_for(Domain.objects.get(fleet__slug="gpu-pair", slug="gpu-a")).status(timeout=10)
print(json.dumps({"ok": call.ok, "error": None if call.ok else str(call.error)}))
"""


def _control_plane_status(tmp_path: Path, port: int) -> dict:
    run = subprocess.run(
        ["bash", "-c", _prelude(tmp_path) + 'haru_admin shell -c "$CALL"'],
        cwd=ROOT,
        env={**os.environ, "CALL": CONTROL_PLANE_CALL, "SUPERVISOR_PORT": str(port)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def _get(port: int, ca: Path, path: str, token: str | None) -> tuple[int, bytes]:
    """GET over HTTPS, verifying the certificate for gpu-a.internal against the CA bundle."""
    ctx = ssl.create_default_context(cafile=str(ca))
    # Strict X.509 checks, as Python 3.13's default context makes them (a CA without keyUsage,
    # a certificate without authorityKeyIdentifier are refused): whatever Python runs this.
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    request = f"GET {path} HTTP/1.1\r\nHost: gpu-a.internal\r\n{auth}Connection: close\r\n\r\n"
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="gpu-a.internal") as conn,
    ):
        conn.sendall(request.encode())
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.mark.integration
def test_the_walkthrough_runs_here_up_to_a_supervisor_answering_over_tls(tmp_path):
    require("openssl")
    run = subprocess.run(
        ["bash", "-c", _rehearsal(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    etc = tmp_path / "etc" / "haru"

    env = _env_file(etc / "haru.env")
    assert [k for k, v in env.items() if "change-me" in v] == []
    for name in SECRETS:
        assert len(env[name]) >= 43, name  # secrets.token_urlsafe(32)
    assert env["HARU_SUPERVISOR_CA_BUNDLE"] == f"{etc}/supervisor-ca.pem"

    tokens = {}
    for host in HOSTS:
        files = etc / "hosts" / host
        config = json.loads((files / "supervisor.json").read_text())
        assert config["host"] == host
        assert config["gpu"] == {"backend": "nvml"}
        assert config["slots"][0]["models"][0]["profile"]["engine"] == "vllm"
        host_env = _env_file(files / "supervisor.env")
        assert [k for k, v in host_env.items() if "change-me" in v] == []
        tokens[host] = host_env["HARU_SUPERVISOR_TOKEN"]
        # As deployed it listens beyond loopback, so over HTTPS: never plain HTTP by name.
        assert host_env["HARU_SUPERVISOR_HOST"] == "0.0.0.0"
        assert host_env.get("HARU_SUPERVISOR_TLS", "auto") != "plain-http"
        assert host_env["HARU_SUPERVISOR_TLS_CERT"] == "/etc/haru/supervisor.pem"
    assert len(set(tokens.values())) == 2, "each host has a token of its own"

    # gpu-a, as its host starts it: supervisor.env's files are the ones rendered for gpu-a.
    files = etc / "hosts" / "gpu-a"
    host_env = _env_file(files / "supervisor.env")
    host_env = {k: v.replace("/etc/haru", str(files)) for k, v in host_env.items()}
    config = _simulated(
        json.loads((files / "supervisor.json").read_text()), tmp_path / "sim-gpu.json", free_port()
    )
    (files / "supervisor.json").write_text(json.dumps(config))
    port = free_port()
    host_env.update(PORT=str(port), HARU_SUPERVISOR_HOST="127.0.0.1")
    proc_env = {k: v for k, v in os.environ.items() if not k.startswith("HARU_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor"],
        cwd=tmp_path,
        env={**proc_env, **host_env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    ca = etc / "supervisor-ca.pem"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if _get(port, ca, "/healthz", None)[0] == 200:
                    break
            except ssl.SSLCertVerificationError:
                raise  # the certificate is wrong: waiting will not mend it
            except OSError:
                pass  # not listening yet
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the supervisor did not answer over HTTPS"
            time.sleep(0.2)
        status, body = _get(port, ca, "/v1/status", tokens["gpu-a"])
        assert status == 200, body
        assert json.loads(body)["host"] == "gpu-a"
        assert _get(port, ca, "/v1/status", None)[0] == 401
        assert _get(port, ca, "/v1/status", tokens["gpu-b"])[0] == 401
        # And the control plane, configured by the walkthrough, reaches it: TLS verified against
        # HARU_SUPERVISOR_CA_BUNDLE, the token derived from the master key, the allow-list.
        assert _control_plane_status(tmp_path, port) == {"ok": True, "error": None}
    finally:
        proc.terminate()
        proc.wait(timeout=60)
