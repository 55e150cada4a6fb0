"""The contract every provisioning driver implements, and the outcomes the provisioning pass reads.

A driver launches, describes and tears down whatever a domain's supervisor runs on (a cloud
cluster, a service, a machine behind an operator's script). It knows nothing of Django or the
database: the provisioning pass (`fleets/reconciler/provision.py`) reads the domain, calls the
driver outside any transaction, and writes each outcome with one guarded UPDATE. Everything a
driver needs comes in as arguments (the domain's names, its validated settings, the supervisor
token); every failure is a `DriverError` with a stable code. Add a driver with one module that
subclasses `ProvisioningDriver` and one line in `fleets/drivers/registry.py`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from common.documents import problems, schema_validator
from common.tls_pin import TlsIdentity

# The supervisor's credential: handed to the node only as a secret, never in settings or argv.
TOKEN_ENV = "HARU_SUPERVISOR_TOKEN"
# The TLS identity the control plane made for a provisioned host (supervisor/tls.py reads
# them); the key is a secret like the token, the certificate goes the same way for simplicity.
TLS_CERT_ENV = "HARU_SUPERVISOR_TLS_CERT_PEM"
TLS_KEY_ENV = "HARU_SUPERVISOR_TLS_KEY_PEM"
# Every supervisor TLS variable: a provisioned host's TLS is Haru's to set, not the envs'.
TLS_ENVS = frozenset(
    {
        TLS_CERT_ENV,
        TLS_KEY_ENV,
        "HARU_SUPERVISOR_TLS",
        "HARU_SUPERVISOR_TLS_CERT",
        "HARU_SUPERVISOR_TLS_KEY",
    }
)
MAX_SUPERVISOR_CONFIG_CHARS = 65_536
# Bound what is kept of a call's output: a status answer is a few KiB.
MAX_OUTPUT_BYTES = 256 * 1024
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_SECRETISH = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|CREDENTIAL)", re.I)


def as_https(url: str) -> str:
    """The supervisor URL a provider reports, on https:// (the host serves the shipped
    identity): providers print http:// or a bare host:port for any port."""
    bare = re.sub(r"^[A-Za-z][A-Za-z0-9+.\-]*://", "", url)
    return f"https://{bare}"


class DriverError(Exception):
    """A driver call that did not do what was asked; `code` is stable, `message` is for people."""

    code = "driver_error"
    retry_elsewhere = False  # True: the same launch may work on the next candidate

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message}


class SettingsRefused(DriverError):
    """Stored settings the driver refuses: the layout loader and the admin refuse these, but a
    hand-edited row can still reach a provisioning pass."""

    code = "invalid_placement"


class DriverSettingsError(ValueError):
    """A domain's placement or driver settings Haru cannot launch; `path` names the field.

    `problems` holds every (path, rule) found, this one first: a schema reports all of a
    document's structural problems at once, a semantic rule the first it meets.
    """

    def __init__(self, path: str, rule: str, *, also: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(f"{path}: {rule}")
        self.path = path
        self.rule = rule
        self.problems = [(path, rule), *also]

    @property
    def messages(self) -> list[str]:
        """Every problem as a `path: rule` line."""
        return [f"{where}: {rule}" for where, rule in self.problems]


def check_structure(name: str, raw: object, path: str) -> None:
    """Raise DriverSettingsError with every way `raw` breaks `fleets/drivers/schemas/<name>.json`
    (checked through `common/documents.py`, like every operator document)."""
    found = problems(schema_validator(__package__, name), raw, path)
    if found:
        (where, rule), *rest = found
        raise DriverSettingsError(where, rule, also=rest)


def check_envs(
    raw: Mapping[str, str], path: str, *, reserved: Callable[[str], bool]
) -> tuple[tuple[str, str], ...]:
    """Return an operator's `envs` as sorted pairs; raise DriverSettingsError for a bad name,
    one Haru sets itself (`reserved`), or one that looks like a credential."""
    out = []
    for name in sorted(raw):
        where = f"{path}.{name}"
        if not _ENV_NAME.match(name):
            raise DriverSettingsError(where, "must be an environment variable name")
        if reserved(name):
            raise DriverSettingsError(where, "is set by Haru itself")
        if _SECRETISH.search(name):
            # envs are written in plain text (a task YAML, a layout); credentials must not be.
            raise DriverSettingsError(
                where,
                "looks like a credential; envs are written in plain text, so keep "
                "credentials in the cloud's secret store or the image",
            )
        out.append((name, raw[name]))
    return tuple(out)


def check_supervisor_config(config: Mapping[str, Any], path: str) -> dict[str, Any]:
    """Return a copy of the supervisor config a driver hands the node; raise
    DriverSettingsError when it is too large or carries the token (Haru passes that)."""
    text = json.dumps(config)
    if len(text) > MAX_SUPERVISOR_CONFIG_CHARS:
        raise DriverSettingsError(path, f"must be at most {MAX_SUPERVISOR_CONFIG_CHARS} characters")
    if TOKEN_ENV.lower() in text.lower() or "token" in {k.lower() for k in config}:
        raise DriverSettingsError(path, "must not carry the supervisor token (Haru passes it)")
    return json.loads(text)


@dataclass(frozen=True)
class ExecResult:
    returncode: int
    output: str  # stdout and stderr together, bounded
    stdout: str


def run_bounded(
    argv: Sequence[str],
    env: Mapping[str, str],
    timeout: float,
    *,
    stdin: bytes | None = None,
    max_bytes: int = MAX_OUTPUT_BYTES,
) -> ExecResult:
    """Run argv (no shell) in a session of its own with a deadline, `stdin` (or nothing) on its
    standard input, and at most `max_bytes` of each output kept; on the deadline kill its whole
    process group and raise TimeoutExpired; raise FileNotFoundError/PermissionError when the
    program cannot be run."""
    # Outputs go to files, not pipes: a child that leaves a daemon behind (holding the output
    # open) still ends the call when it exits itself.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(  # noqa: S603 - argv list, no shell
            list(argv),
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=out,
            stderr=err,
            env=dict(env),
            start_new_session=True,
        )
        try:
            if stdin is not None and proc.stdin is not None:
                try:
                    proc.stdin.write(stdin)  # small: fits the pipe's buffer
                    proc.stdin.close()
                except BrokenPipeError:
                    pass  # the child did not read it
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        out.seek(0)
        err.seek(0)
        stdout = out.read(max_bytes).decode("utf-8", "replace")
        stderr = err.read(max_bytes).decode("utf-8", "replace")
    return ExecResult(proc.returncode, f"{stdout}\n{stderr}".strip(), stdout)


@dataclass(frozen=True)
class Target:
    """The domain a driver acts on: its names, and its settings as `validate` returned them."""

    fleet_slug: str
    domain_slug: str
    domain_id: str
    name: str  # the driver's name for what it runs (`resource_name`): in events and status
    settings: Any


class Progress(StrEnum):
    PENDING = "pending"  # still coming up: look again next pass
    UP = "up"  # the supervisor's URL is known
    FAILED = "failed"  # this launch will not come up: back off and launch again


@dataclass(frozen=True)
class Described:
    """Where a launch stands, as `describe` found it."""

    progress: Progress
    supervisor_url: str = ""
    serving_base_url: str = ""
    error: DriverError | None = None  # FAILED: why (the pass backs off with it)


PENDING = Described(Progress.PENDING)


@dataclass(frozen=True)
class TornDown:
    """What `stop` did: `mode` ("stop" or "down") as done, and whether nothing is left running."""

    mode: str
    gone: bool


class ProvisioningDriver(ABC):
    """Launch, describe and tear down a domain's supervisor host; start nothing on `validate`."""

    name: str
    # Whether `validate` reads `placement` (a cloud placement); else it is free description,
    # checked by the layout schema only, as for a static domain.
    uses_placement: bool = False
    # Whether `launch` ships the TLS identity the control plane made for the host (and so the
    # supervisor is reached over https:// with that identity's pin); else the layout's
    # supervisorTransport and supervisorFingerprint say how it is reached.
    ships_tls: bool = False

    @abstractmethod
    def validate(self, *, placement: object, settings: object, path: str = "") -> Any:
        """Return the parsed settings; raise DriverSettingsError naming every field it can
        (`<path>placement.…`, `<path>driver.…`)."""

    def candidates(self, settings: Any) -> tuple[str, ...]:
        """Return the places to try a launch in, in order (labels); at least one."""
        return (self.name,)

    def resource_name(self, *, fleet_slug: str, domain_slug: str) -> str:
        """Return the stable name of what this domain runs on (a cluster, a service, a host)."""
        return f"haru-{fleet_slug}-{domain_slug}"

    @abstractmethod
    def remove(self, target: Target) -> None:
        """Tear down whatever an earlier life of the domain left; nothing there is not an
        error. Raise DriverError."""

    @abstractmethod
    def launch(
        self, target: Target, *, candidate: int, token: str | None, tls: TlsIdentity | None = None
    ) -> str:
        """Start a launch on `candidates()[candidate]` with the supervisor token (None: none is
        configured; refuse) and, for a driver that `ships_tls`, the host's TLS identity (its
        key a secret like the token), and return a non-empty handle for `describe`; never wait
        for the host to come up. Raise DriverError."""

    @abstractmethod
    def describe(self, target: Target, *, handle: str | None) -> Described:
        """Say where the launch `handle` stands (None: its handle was never recorded). A
        FAILED answer has already cleaned up what must not outlive it. Raise DriverError when
        the question itself failed."""

    @abstractmethod
    def stop(self, target: Target, *, mode: str) -> TornDown:
        """Stop ("stop": keep disks) or tear down ("down") the domain's host and say whether
        nothing is left running. Raise DriverError."""
