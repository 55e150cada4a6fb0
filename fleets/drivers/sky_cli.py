"""A thin wrapper over the `sky` CLI: argv lists (never a shell), a deadline on every call,
bounded output, and every failure mapped to one `DriverError` subclass.

The CLI runs from SkyPilot's own environment (`HARU_SKY_VENV`; its pins conflict with ours), and
only ever outside a database transaction, from the provisioning tick: never on a request path.
The exec is injectable: tests put a scripted `sky` on PATH, or pass a fake exec.

Output shapes relied on (SkyPilot 0.14, see docs/drivers.md):
- `sky launch --async` prints `Submitted sky.launch request: <request id>`;
- `sky api status -a -o json <id>` prints a list of `{request_id, name, status, ...}`;
- `sky status -o json --refresh <cluster>` prints a list of cluster records with `name`,
  `status` (INIT, UP, STOPPED), `cloud`, `region`, ... (`handle`, holding the IPs, is left out);
- `sky status --endpoint <port> <cluster>` prints `<host>:<port>` of an UP cluster;
- `sky serve status <service>` prints a table (no JSON); `--endpoint` prints the endpoint only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleets.drivers.base import DriverError, ExecResult, run_bounded

# Every call has a deadline; launches submit a request and return, so none needs long.
DEFAULT_TIMEOUT_S = 60.0
STATUS_TIMEOUT_S = 90.0  # --refresh asks the cloud
# How much of a failed call's output goes into an error message.
ERROR_TAIL_CHARS = 600


def _failure(name: str, code: str, *, retry_elsewhere: bool = False) -> type[DriverError]:
    """Return the DriverError subclass of one way a `sky` call fails (docs/drivers.md's table)."""
    return type(name, (DriverError,), {"code": code, "retry_elsewhere": retry_elsewhere})


SkyCliMissing = _failure("SkyCliMissing", "sky_cli_missing")
SkyNoCredentials = _failure("SkyNoCredentials", "sky_no_credentials")
# The same launch may work in another region or zone.
SkyCapacity = _failure("SkyCapacity", "sky_capacity", retry_elsewhere=True)
SkyClusterUnknown = _failure("SkyClusterUnknown", "sky_cluster_unknown")
SkySecretMissing = _failure("SkySecretMissing", "sky_secret_missing")
SkyTimeout = _failure("SkyTimeout", "sky_timeout")
SkyCommandFailed = _failure("SkyCommandFailed", "sky_command_failed")
SkyBadOutput = _failure("SkyBadOutput", "sky_bad_output")


# Order matters: the first pattern that matches names the failure.
_FAILURE_PATTERNS: tuple[tuple[type[DriverError], re.Pattern[str]], ...] = (
    (SkySecretMissing, re.compile(r"is not set in local environment", re.I)),
    (
        SkyNoCredentials,
        re.compile(
            r"no cloud(s)? (is |are )?enabled|not enabled|credential|sky check|"
            r"unable to locate credentials|could not find default credentials|"
            r"authentication|permission denied|access ?denied|unauthori[sz]ed",
            re.I,
        ),
    ),
    (
        SkyCapacity,
        re.compile(
            r"ResourcesUnavailableError|quota|insufficient ?(instance)?capacity|"
            r"capacity|out of stock|stockout|no (launchable|available) resource|"
            r"failed to (acquire|provision) resources|ZONE_RESOURCE_POOL_EXHAUSTED|"
            r"InsufficientInstanceCapacity|not available in",
            re.I,
        ),
    ),
    (
        SkyClusterUnknown,
        re.compile(
            r"cluster\(?s?\)? .{0,80}(not found|does not exist)|does not exist|not found|"
            r"no existing (cluster|service)",
            re.I,
        ),
    ),
)


def classify_failure(output: str, *, what: str) -> DriverError:
    """Map a failed call's output to the driver error it means."""
    tail = output.strip()[-ERROR_TAIL_CHARS:]
    for kind, pattern in _FAILURE_PATTERNS:
        if pattern.search(output):
            return kind(f"{what}: {tail}")
    return SkyCommandFailed(f"{what} failed: {tail or '(no output)'}")


Exec = Callable[[Sequence[str], Mapping[str, str], float], ExecResult]


def subprocess_exec(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> ExecResult:
    """Run argv (no shell) with a deadline; raise FileNotFoundError or TimeoutExpired."""
    return run_bounded(argv, env, timeout)


@dataclass(frozen=True)
class ClusterRecord:
    name: str
    status: str  # INIT, UP, STOPPED (SkyPilot's ClusterStatus)
    cloud: str | None
    region: str | None
    raw: dict[str, Any]


@dataclass(frozen=True)
class ServiceRecord:
    name: str
    status: str  # CONTROLLER_INIT, REPLICA_INIT, READY, FAILED, ... (SkyServe's)
    endpoint: str | None
    replica_endpoints: tuple[str, ...]  # READY replicas' endpoints, lowest id first


# Haru's own variables, never passed to the `sky` process.
_HARU_ONLY_PREFIXES = ("HARU_", "DJANGO_", "CELERY_")
_HARU_ONLY_NAMES = frozenset({"DATABASE_URL", "REDIS_URL"})
_REQUEST_ID = re.compile(r"Submitted [\w.]+ request:\s*([0-9A-Za-z-]+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _sky_path(venv: str | None) -> str:
    if venv:
        return str(Path(venv) / "bin" / "sky")
    return "sky"


class SkyCli:
    """The `sky` commands the drivers use; every method raises a DriverError on failure."""

    def __init__(
        self,
        *,
        venv: str | None = None,
        exec_: Exec = subprocess_exec,
        environ: Mapping[str, str] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.sky = _sky_path(venv)
        self._exec = exec_
        self._environ = dict(os.environ if environ is None else environ)
        self.timeout_s = timeout_s

    # -- plumbing -------------------------------------------------------------------------

    def _env(self, secrets: Mapping[str, str] | None) -> dict[str, str]:
        # The `sky` child needs the cloud credentials (AWS_*, GOOGLE_*, KUBECONFIG, ~ via HOME)
        # but none of Haru's own: no HARU_* variable, no database or broker URL (passwords).
        env = {
            k: v
            for k, v in self._environ.items()
            if not k.startswith(_HARU_ONLY_PREFIXES) and k not in _HARU_ONLY_NAMES
        }
        # Only the secrets this call passes by name reach the `sky` process: `--secret NAME`
        # reads NAME from its environment, so the value never sits on a command line.
        env.update(secrets or {})
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _run(
        self,
        args: Sequence[str],
        *,
        what: str,
        timeout: float | None = None,
        secrets: Mapping[str, str] | None = None,
    ) -> ExecResult:
        argv = [self.sky, *args]
        deadline = timeout or self.timeout_s
        try:
            result = self._exec(argv, self._env(secrets), deadline)
        except FileNotFoundError:
            raise SkyCliMissing(
                f"{what}: the sky CLI was not found at {self.sky!r}; run `make sky-env` and set "
                "HARU_SKY_VENV"
            ) from None
        except subprocess.TimeoutExpired:
            raise SkyTimeout(f"{what}: no answer within {deadline:.0f} s") from None
        output = _scrub(_ANSI.sub("", result.output), secrets)
        if result.returncode != 0:
            raise classify_failure(output, what=what)
        return ExecResult(result.returncode, output, _scrub(_ANSI.sub("", result.stdout), secrets))

    # -- clusters -------------------------------------------------------------------------

    def launch(
        self, *, cluster: str, yaml_text: str, secrets: Mapping[str, str], serve: bool = False
    ) -> str:
        """Submit a launch (or `serve up`) and return SkyPilot's request id; never waits for
        provisioning (`--async`; `-d` would still wait)."""
        with tempfile.TemporaryDirectory(prefix="haru-sky-") as tmp:
            # The file holds the rendered YAML only: secrets are references, values go by env.
            path = Path(tmp) / f"{cluster}.yaml"
            path.write_text(yaml_text)
            secret_flags = [arg for name in sorted(secrets) for arg in ("--secret", name)]
            if serve:
                args = ["serve", "up", "-n", cluster, "-y", "--async", *secret_flags, str(path)]
            else:
                args = ["launch", "-c", cluster, "-y", "--async", *secret_flags, str(path)]
            result = self._run(args, what=f"launch {cluster}", secrets=secrets)
        match = _REQUEST_ID.search(result.output)
        if match is None:
            raise SkyBadOutput(f"launch {cluster}: no request id in the output")
        return match.group(1)

    def request_status(self, request_id: str) -> str | None:
        """Return a request's status (PENDING, RUNNING, SUCCEEDED, FAILED, CANCELLED), or None
        if the API server no longer knows it."""
        result = self._run(
            ["api", "status", "-a", "-o", "json", request_id], what=f"request {request_id}"
        )
        rows = _json_list(result.stdout, what=f"request {request_id}")
        for row in rows:
            if isinstance(row, dict) and str(row.get("request_id", "")).startswith(request_id):
                status = row.get("status")
                return str(status).upper() if status is not None else None
        return None

    def request_logs(self, request_id: str) -> str:
        """Return the tail of a finished request's log (to name why a launch failed)."""
        result = self._run(["api", "logs", request_id], what=f"request {request_id} logs")
        return result.output[-ERROR_TAIL_CHARS * 4 :]

    def status(self, cluster: str) -> ClusterRecord | None:
        """Return the cluster's record (refreshed from the cloud), or None if there is none."""
        result = self._run(
            ["status", "-o", "json", "--refresh", cluster],
            what=f"status {cluster}",
            timeout=max(self.timeout_s, STATUS_TIMEOUT_S),
        )
        for row in _json_list(result.stdout, what=f"status {cluster}"):
            if isinstance(row, dict) and row.get("name") == cluster:
                return ClusterRecord(
                    name=cluster,
                    status=str(row.get("status", "")).upper(),
                    cloud=row.get("cloud"),
                    region=row.get("region"),
                    raw={
                        k: row[k] for k in ("status", "cloud", "region", "launched_at") if k in row
                    },
                )
        return None

    def endpoint(self, cluster: str, port: int) -> str:
        """Return `http://host:port` for a port of an UP cluster's head node."""
        result = self._run(
            ["status", "--endpoint", str(port), cluster], what=f"endpoint {cluster}:{port}"
        )
        return _as_url(result.stdout, what=f"endpoint {cluster}:{port}")

    def stop(self, cluster: str) -> None:
        """Stop the cluster (disks kept, so a later launch restarts it)."""
        self._run(["stop", "-y", cluster], what=f"stop {cluster}")

    def down(self, cluster: str) -> None:
        """Tear the cluster down; a cluster that does not exist counts as down."""
        try:
            self._run(["down", "-y", cluster], what=f"down {cluster}")
        except SkyClusterUnknown:
            return

    # -- services -------------------------------------------------------------------------

    def serve_status(self, service: str) -> ServiceRecord | None:
        """Return the service's status scraped from the table (SkyServe has no JSON output)."""
        try:
            result = self._run(["serve", "status", service], what=f"serve status {service}")
        except SkyClusterUnknown:
            return None
        return parse_serve_table(result.stdout, service)

    def serve_endpoint(self, service: str) -> str:
        result = self._run(
            ["serve", "status", "--endpoint", service], what=f"serve endpoint {service}"
        )
        return _as_url(result.stdout, what=f"serve endpoint {service}")

    def serve_down(self, service: str) -> None:
        """Tear the service down; a service that does not exist counts as down."""
        try:
            self._run(["serve", "down", "-y", service], what=f"serve down {service}")
        except SkyClusterUnknown:
            return


def _scrub(text: str, secrets: Mapping[str, str] | None) -> str:
    # Belt and braces: SkyPilot redacts secrets, but nothing it prints may carry one onwards.
    # A multi-line secret (the TLS key's PEM) is scrubbed line by line too, should a line of it
    # be echoed alone; its short armour lines ("-----END ...") say nothing.
    for value in (secrets or {}).values():
        if value:
            text = text.replace(value, "<redacted>")
            for line in value.splitlines():
                if len(line.strip()) >= 16 and not line.startswith("-----"):
                    text = text.replace(line.strip(), "<redacted>")
    return text


def _json_list(text: str, *, what: str) -> list[Any]:
    # The JSON is the last thing printed; anything before it (hints, warnings) is skipped.
    start = text.find("[")
    try:
        value = json.loads(text[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list):
        raise SkyBadOutput(f"{what}: expected a JSON list, got {text.strip()[:200]!r}")
    return value


_HOSTPORT = re.compile(r"(https?://)?([A-Za-z0-9.-]+|\[[0-9a-fA-F:]+\]):(\d{1,5})")


def _as_url(text: str, *, what: str) -> str:
    for line in reversed(text.strip().splitlines()):
        match = _HOSTPORT.search(line.strip())
        if match:
            scheme = match.group(1) or "http://"
            return f"{scheme}{match.group(2)}:{match.group(3)}"
    raise SkyBadOutput(f"{what}: no host:port in {text.strip()[:200]!r}")


def parse_serve_table(text: str, service: str) -> ServiceRecord | None:
    """Read one service's row and its READY replicas from `sky serve status` tables."""
    lines = [line.rstrip() for line in text.splitlines()]
    status = endpoint = None
    replicas: list[tuple[int, str]] = []
    header: list[str] | None = None
    for line in lines:
        cells = line.split()
        if not cells:
            header = None
            continue
        if cells[0] in ("NAME", "SERVICE_NAME"):
            header = cells
            continue
        if header is None or cells[0] != service:
            continue
        if header[0] == "NAME" and "STATUS" in header:
            status = cells[_col(header, cells, "STATUS")]
            endpoint = cells[-1] if header[-1] == "ENDPOINT" and cells[-1] != "-" else None
        elif (
            header[0] == "SERVICE_NAME"
            and cells[-1] == "READY"
            and len(cells) > 3
            and cells[1].isdigit()
            and cells[3] != "-"
        ):
            replicas.append((int(cells[1]), cells[3]))
    if status is None:
        return None
    urls = tuple(_as_url(ep, what="replica") for _, ep in sorted(replicas))
    return ServiceRecord(service, status, endpoint, urls)


def _col(header: list[str], cells: list[str], name: str) -> int:
    # UPTIME may print as several words ("1h 2m"): count STATUS from the right when it does.
    index = header.index(name)
    if len(cells) == len(header):
        return index
    return index - len(header) + len(cells)
