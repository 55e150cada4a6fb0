"""The `script` driver: the operator's own commands launch, describe and stop a domain's host.

For whatever has a command line and no SkyPilot: bare metal behind IPMI, an on-prem scheduler,
a VM tool. Each command is an argv list (no shell) run with a deadline per phase, its standard
input closed, and an environment of exactly: PATH, HOME, LANG, LC_ALL and TMPDIR as the
provisioning process has them, the layout's `envs` (non-secret by rule), and Haru's own
`HARU_*` variables below. The supervisor token never goes into argv, the environment, events
or logs: the launch command reads it as one line on its standard input (the other commands get
none) and hands it to the supervisor as its HARU_SUPERVISOR_TOKEN; its output is scrubbed of it.

- launch: started once per attempt; exits 0 once the host is on its way (it must not wait for
  the supervisor). Gets HARU_LAUNCH_ID (new per attempt) and, when the layout gives one,
  HARU_SUPERVISOR_CONFIG (the supervisor config as inline JSON).
- describe: prints one JSON object (`schemas/script_describe.json`, at most 16 KiB): `state`
  pending / up / failed / stopped, `supervisorUrl` when up, optionally `servingBaseUrl` and
  `message`. Anything else is refused (`script_bad_output`) and changes nothing.
- stop: stops the host; gets HARU_STOP_MODE (`stop` keeps disks, `down` removes everything);
  describe must then answer `stopped`.
Every command gets HARU_FLEET, HARU_DOMAIN, HARU_DOMAIN_ID and HARU_RESOURCE (`haru-FLEET-DOMAIN`).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from common.documents import problems, schema_validator
from common.tls_pin import TlsIdentity
from fleets.drivers.base import (
    PENDING,
    Described,
    DriverError,
    DriverSettingsError,
    ExecResult,
    Progress,
    ProvisioningDriver,
    Target,
    TornDown,
    check_envs,
    check_structure,
    check_supervisor_config,
    run_bounded,
)

PHASES = ("launch", "describe", "stop")
DEFAULT_TIMEOUT_S = {"launch": 60, "describe": 30, "stop": 60}
# A describe answer is a few hundred bytes; more is a script printing something else.
MAX_DESCRIBE_BYTES = 16 * 1024
ERROR_TAIL_CHARS = 600
# What the commands inherit from the provisioning process: enough to find programs and their
# own configuration, nothing of Haru's (no HARU_*, no database or broker URL).
INHERITED_ENVS = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")

Run = Callable[..., ExecResult]


class ScriptError(DriverError):
    """A script driver failure; `code` says which (the table in docs/drivers.md)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ScriptSettings:
    """A script-driven domain's validated settings."""

    commands: Mapping[str, tuple[str, ...]]  # launch, describe, stop
    timeouts_s: Mapping[str, int]
    envs: tuple[tuple[str, str], ...]
    supervisor_config: dict[str, Any] | None
    stop_mode: str | None


def parse_script_settings(raw: object, *, path: str = "driver") -> ScriptSettings:
    """Validate a script domain's `driver` object; raise DriverSettingsError naming the field."""
    check_structure("script", raw, path)
    raw = cast(Mapping[str, Any], raw)  # an object: the schema said so
    for phase in PHASES:
        program = raw[phase][0]
        if "/" in program and not os.path.isabs(program):
            # Relative to what? The server's working directory is nobody's choice.
            raise DriverSettingsError(
                f"{path}.{phase}[0]", "must be an absolute path or a program name on PATH"
            )
    config = raw.get("supervisorConfig")
    timeouts = raw.get("timeouts", {})
    return ScriptSettings(
        commands={phase: tuple(raw[phase]) for phase in PHASES},
        timeouts_s={p: timeouts.get(f"{p}S", DEFAULT_TIMEOUT_S[p]) for p in PHASES},
        envs=check_envs(
            raw.get("envs", {}), f"{path}.envs", reserved=lambda name: name.startswith("HARU_")
        ),
        supervisor_config=(
            None if config is None else check_supervisor_config(config, f"{path}.supervisorConfig")
        ),
        stop_mode=raw.get("stopMode"),
    )


def parse_describe(stdout: str, *, what: str) -> dict[str, Any]:
    """Return describe's answer; raise ScriptError(script_bad_output) for anything but one JSON
    object of `schemas/script_describe.json`."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise ValueError("a key is repeated")
        return dict(pairs)

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        answer = json.loads(stdout, object_pairs_hook=no_duplicates, parse_constant=no_constant)
    except (ValueError, RecursionError) as exc:
        shown = stdout.strip()[:200]
        raise ScriptError(
            "script_bad_output", f"{what}: not one JSON object ({exc}): {shown!r}"
        ) from None
    found = problems(schema_validator(__package__, "script_describe"), answer, "")
    if found:
        rules = "; ".join(f"{where}: {rule}" if where else rule for where, rule in found)
        raise ScriptError("script_bad_output", f"{what}: {rules}")
    return cast(dict[str, Any], answer)


class ScriptDriver(ProvisioningDriver):
    name = "script"

    def __init__(self, *, run: Run = run_bounded, environ: Mapping[str, str] | None = None) -> None:
        self._run_command = run
        self._environ = dict(os.environ if environ is None else environ)

    def validate(self, *, placement: object, settings: object, path: str = "") -> ScriptSettings:
        return parse_script_settings(settings, path=f"{path}driver")

    def remove(self, target: Target) -> None:
        self._run(target, "stop", extra={"HARU_STOP_MODE": "down"})

    def launch(
        self, target: Target, *, candidate: int, token: str | None, tls: TlsIdentity | None = None
    ) -> str:
        # ships_tls is False: the operator's host serves its own certificate, which the
        # layout's supervisorFingerprint (or HARU_SUPERVISOR_CA_BUNDLE) trusts.
        if not token:
            raise ScriptError(
                "script_token_missing",
                "HARU_SUPERVISOR_MASTER_KEY is not set: a provisioned supervisor must require a "
                "token",
            )
        launch_id = uuid.uuid4().hex[:16]
        extra = {"HARU_LAUNCH_ID": launch_id}
        config = target.settings.supervisor_config
        if config is not None:
            extra["HARU_SUPERVISOR_CONFIG"] = json.dumps(config, separators=(",", ":"))
        self._run(target, "launch", extra=extra, token=token)
        return launch_id

    def describe(self, target: Target, *, handle: str | None) -> Described:
        answer = self._describe(target, handle)
        state = answer["state"]
        if state == "up":
            return Described(
                Progress.UP,
                supervisor_url=answer["supervisorUrl"],
                serving_base_url=answer.get("servingBaseUrl", ""),
            )
        if state == "pending":
            return PENDING
        # failed, or stopped after a launch: this launch will not come up; launch again.
        why = answer.get("message") or ("the host is not running" if state == "stopped" else "")
        error = ScriptError("script_launch_failed", f"describe {target.name}: {state}: {why}")
        return Described(Progress.FAILED, error=error)

    def stop(self, target: Target, *, mode: str) -> TornDown:
        self._run(target, "stop", extra={"HARU_STOP_MODE": mode})
        return TornDown(mode, gone=self._describe(target, None)["state"] == "stopped")

    # -- plumbing -------------------------------------------------------------------------

    def _describe(self, target: Target, handle: str | None) -> dict[str, Any]:
        extra = {"HARU_LAUNCH_ID": handle} if handle else {}
        result = self._run(target, "describe", extra=extra)
        what = f"describe {target.name}"
        if len(result.stdout.encode()) > MAX_DESCRIBE_BYTES:
            raise ScriptError(
                "script_bad_output", f"{what}: printed more than {MAX_DESCRIBE_BYTES} bytes"
            )
        return parse_describe(result.stdout, what=what)

    def _env(self, target: Target, extra: Mapping[str, str]) -> dict[str, str]:
        env = {k: self._environ[k] for k in INHERITED_ENVS if k in self._environ}
        env.update(target.settings.envs)
        env.update(
            {
                "HARU_FLEET": target.fleet_slug,
                "HARU_DOMAIN": target.domain_slug,
                "HARU_DOMAIN_ID": target.domain_id,
                "HARU_RESOURCE": target.name,
                **extra,
            }
        )
        return env

    def _run(
        self,
        target: Target,
        phase: str,
        *,
        extra: Mapping[str, str],
        token: str | None = None,
    ) -> ExecResult:
        settings: ScriptSettings = target.settings
        argv: Sequence[str] = settings.commands[phase]
        timeout = settings.timeouts_s[phase]
        what = f"{phase} {target.name}"
        stdin = f"{token}\n".encode() if token else None
        # describe's answer is bounded below; one byte over tells "too long" from "just fits".
        limit = MAX_DESCRIBE_BYTES + 1 if phase == "describe" else None
        try:
            result = self._run_command(
                argv,
                self._env(target, extra),
                timeout,
                stdin=stdin,
                **({"max_bytes": limit} if limit else {}),
            )
        except (FileNotFoundError, PermissionError) as exc:
            raise ScriptError(
                "script_missing", f"{what}: cannot run {argv[0]!r}: {exc.strerror}"
            ) from None
        except subprocess.TimeoutExpired:
            raise ScriptError("script_timeout", f"{what}: no answer within {timeout} s") from None
        output = result.output.replace(token, "<redacted>") if token else result.output
        if result.returncode != 0:
            tail = output.strip()[-ERROR_TAIL_CHARS:] or "(no output)"
            raise ScriptError("script_failed", f"{what} failed (exit {result.returncode}): {tail}")
        return result
