"""The supervisor's environment variables, validated with clear errors."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from common.edge.limits import EdgeLimit, EdgeLimits, edge_settings
from common.loopback import is_loopback
from common.secret_strength import secret_weakness
from common.setting import SIMULATOR, SUPERVISOR, TRAINER, Kind, Section, declared

DEFAULT_PORT = 8701
DEFAULT_BIND = "127.0.0.1"
LOG_LEVELS = ("debug", "info", "warning", "error")
TLS_AUTO, TLS_ON, TLS_PLAIN = "auto", "on", "plain-http"
TLS_MODES = (TLS_AUTO, TLS_ON, TLS_PLAIN)

# The headings of the docs, each with the processes that read its variables.
AGENT = Section("Listening, credentials and children", (SUPERVISOR,))
EDGE = Section("Supervisor HTTP limits", (SUPERVISOR,))
ADAPTERS = Section("Supervisor adapter store", (SUPERVISOR,))
HANDED_TO_TRAINERS = Section("Handed to trainers", (TRAINER,))
HANDED_TO_SIMULATOR = Section("Handed to the simulator", (SIMULATOR,))


class SupervisorSettings:
    """The supervisor's variables, declared once (common/setting.py); docs/configuration.md is
    generated from this class and the control plane's (haru/setting_docs.py)."""

    config = AGENT.text(
        "HARU_SUPERVISOR_CONFIG",
        shown_default="– (required)",
        doc="the host's slots and models: inline JSON or the path of a JSON file",
    )
    port = AGENT.integer(
        "PORT",
        DEFAULT_PORT,
        1,
        65535,
        doc="the supervisor's port (the control plane's server reads PORT too, default 8700)",
    )
    bind_host = AGENT.text(
        "HARU_SUPERVISOR_HOST",
        shown_default=DEFAULT_BIND,
        doc="bind address; one beyond loopback needs HARU_SUPERVISOR_TOKEN, at least 32 "
        "characters and no placeholder",
    )
    token = AGENT.text(
        "HARU_SUPERVISOR_TOKEN",
        doc="bearer token on every `/v1/` route: this domain's own token, printed on the "
        "control plane by `manage.py supervisor_token <fleet>/<domain>`. Unset: loopback only",
    )
    tls = AGENT.text(
        "HARU_SUPERVISOR_TLS",
        kind=Kind.CHOICE,
        choices=TLS_MODES,
        shown_default="auto",
        doc="`auto`: HTTPS whenever the bind is beyond loopback (the operator's certificate, "
        "else a self-signed one made once in the state dir, its fingerprint printed by "
        "`python -m supervisor tls-fingerprint`), plain HTTP on loopback; `on`: HTTPS on "
        "loopback too; `plain-http`: plain HTTP beyond loopback as well, warned about at "
        'start-up (docs/supervisor.md, "TLS")',
    )
    tls_cert = AGENT.text(
        "HARU_SUPERVISOR_TLS_CERT",
        kind=Kind.FILE,
        shown_default="unset: self-signed beyond loopback",
        doc="PEM certificate (chain) to serve HTTPS with; goes with HARU_SUPERVISOR_TLS_KEY",
    )
    tls_key = AGENT.text(
        "HARU_SUPERVISOR_TLS_KEY",
        kind=Kind.FILE,
        shown_default="unset: self-signed beyond loopback",
        doc="the certificate's private key (PEM); both or neither",
    )
    tls_cert_pem = AGENT.text(
        "HARU_SUPERVISOR_TLS_CERT_PEM",
        shown_default="unset",
        doc="the certificate itself (PEM text), with HARU_SUPERVISOR_TLS_KEY_PEM: how a "
        "provisioned host gets the identity the control plane made and pinned for it "
        "(a SkyPilot secret); not with the file variables",
    )
    tls_key_pem = AGENT.text(
        "HARU_SUPERVISOR_TLS_KEY_PEM",
        shown_default="unset",
        doc="that certificate's private key (PEM text); never written to disk for longer "
        "than loading it takes",
    )
    log_level = AGENT.text(
        "HARU_SUPERVISOR_LOG_LEVEL",
        kind=Kind.CHOICE,
        choices=LOG_LEVELS,
        shown_default="info",
        doc="how much the supervisor logs",
    )
    child_env_allow = AGENT.listing(
        "HARU_CHILD_ENV_ALLOW",
        shown_default="none added",
        doc="names (or `PREFIX*` families) a model server or trainer inherits beyond the "
        "allow-list (docs/supervisor.md), as they are: HF_TOKEN for a gated model, say",
    )

    # The HTTP edge (common/edge/protocol.py). The supervisor listens beyond loopback when the
    # control plane is on another host, and the header phase comes before the token check, so
    # each bound holds for unauthenticated clients too. Its callers are a few control-plane
    # processes sending small requests: tighter than the control plane's own edge (HARU_HTTP_*),
    # which also serves chat clients.
    (
        header_timeout_ms,
        body_timeout_ms,
        keepalive_timeout_ms,
        max_header_bytes,
        max_headers,
        max_body_bytes,
        max_connections,
        max_connections_per_address,
    ) = edge_settings(
        "HARU_SUPERVISOR_HTTP_",
        {
            "header_timeout_ms": EdgeLimit(
                10_000, "as HARU_HTTP_HEADER_TIMEOUT_MS: the connection is closed"
            ),
            "body_timeout_ms": EdgeLimit(10_000, "408 `request_timeout`"),
            "keepalive_timeout_ms": EdgeLimit(
                5_000, "an idle kept-alive connection is closed (uvicorn's default, kept)"
            ),
            "max_header_bytes": EdgeLimit(16_384, "431 `headers_too_large`"),
            "max_headers": EdgeLimit(64, "431 `too_many_headers`"),
            # At least the API's own cap on a control body (supervisor/api.py MAX_BODY_BYTES),
            # whose finer refusal answers first below this one.
            "max_body_bytes": EdgeLimit(
                1024**2,
                "a larger body: 413 `request_too_large` before any of it is read and before "
                "the token is checked",
                low=64 * 1024,
                high=2**30,
            ),
            "max_connections": EdgeLimit(
                256,
                "the longest-idle connection is closed to make room, so `/healthz` and "
                "`/v1/status` keep answering; the open-file limit is raised to twice the cap "
                "plus 256",
            ),
            # Half the cap: the control plane's few concurrent calls to one supervisor stay far
            # below it, and one address leaves the other half to everyone else.
            "max_connections_per_address": EdgeLimit(
                128,
                "past it a new connection from that address is closed at once, so one address "
                "cannot take every slot; 127.0.0.1 (uvicorn's `FORWARDED_ALLOW_IPS`) is exempt",
            ),
        },
        EDGE,
    )

    # The adapter store and its transfers (supervisor/adapters.py, docs/adapters.md).
    adapter_store_bytes = ADAPTERS.integer(
        "HARU_SUPERVISOR_ADAPTER_STORE_BYTES",
        16 * 1024**3,
        1024**2,
        2**44,
        doc="the most bytes all stored LoRA adapters may take together; an import or a commit "
        "past it is refused (507 `store_full`, a checkpoint listed under `rejected`)",
    )
    adapter_max_bytes = ADAPTERS.integer(
        "HARU_SUPERVISOR_ADAPTER_MAX_BYTES",
        2 * 1024**3,
        1024,
        2**40,
        doc="the most bytes one adapter's files may take; a transfer past it is refused 413",
    )
    adapter_chunk_bytes = ADAPTERS.integer(
        "HARU_SUPERVISOR_ADAPTER_CHUNK_BYTES",
        8 * 1024**2,
        64 * 1024,
        2**30,
        doc="the body cap of `PUT /v1/adapters/{id}/files/{path}` alone (an authenticated one; "
        "every other route keeps HARU_SUPERVISOR_HTTP_MAX_BODY_BYTES): 413 past it",
    )
    adapter_chunk_timeout_ms = ADAPTERS.integer(
        "HARU_SUPERVISOR_ADAPTER_CHUNK_TIMEOUT_MS",
        120_000,
        1_000,
        3_600_000,
        doc="the body deadline of that PUT (an 8 MiB chunk over a slow link takes longer than "
        "a control body's HARU_SUPERVISOR_HTTP_BODY_TIMEOUT_MS): 408 past it",
    )


@dataclass(frozen=True)
class AdapterLimits:
    """The adapter store's bounds (the HARU_SUPERVISOR_ADAPTER_* settings)."""

    store_bytes: int = SupervisorSettings.adapter_store_bytes.default
    max_bytes: int = SupervisorSettings.adapter_max_bytes.default
    chunk_bytes: int = SupervisorSettings.adapter_chunk_bytes.default
    chunk_timeout_s: float = SupervisorSettings.adapter_chunk_timeout_ms.default / 1000


def adapter_limits_from_env(environ: Mapping[str, str]) -> AdapterLimits:
    table = SupervisorSettings

    def read(setting: Any) -> int:
        return _integer(environ, setting.env, setting.default, setting.minimum, setting.maximum)

    return AdapterLimits(
        store_bytes=read(table.adapter_store_bytes),
        max_bytes=read(table.adapter_max_bytes),
        chunk_bytes=read(table.adapter_chunk_bytes),
        chunk_timeout_s=read(table.adapter_chunk_timeout_ms) / 1000,
    )


class ChildEnvironment:
    """What the supervisor hands the processes it starts (supervisor/training.py), and what the
    simulator reads: the trainer contract, not for operators to set."""

    checkpoint_dir = HANDED_TO_TRAINERS.text(
        "HARU_CHECKPOINT_DIR",
        kind=Kind.PATH,
        doc="the slot's `checkpointDir`: resume from the newest checkpoint here, write new ones "
        "here",
    )
    gpu_index = HANDED_TO_TRAINERS.integer(
        "HARU_GPU_INDEX",
        0,
        0,
        1023,
        doc="the slot's GPU (also pinned through `CUDA_VISIBLE_DEVICES`)",
    )
    gpu_memory_limit_mib = HANDED_TO_TRAINERS.optional_integer(
        "HARU_GPU_MEMORY_LIMIT_MIB",
        1,
        2**31 - 1,
        shown_default="unset when the slot has no `memoryLimitMiB`",
        doc="the most GPU memory the trainer may use: what the sleeping servers leave, less a "
        "margin",
    )
    sim_gpu_state = HANDED_TO_SIMULATOR.text(
        "HARU_SIM_GPU_STATE",
        kind=Kind.PATH,
        doc="the simulated GPUs' shared state file (the supervisor's `simStateFile`), for the "
        "simulated engine and trainer in tests and the demo",
    )


# (variable, default, minimum, maximum) of each edge bound, by EdgeLimits' own key.
EDGE_SETTINGS: dict[str, tuple[str, int, int, int]] = {
    s.key: (s.env, s.default, s.minimum or 0, s.maximum or 0)
    for s in declared(SupervisorSettings)
    if s.area == EDGE.area
}


class SettingsError(Exception):
    """The environment cannot start a supervisor; the message says which variable and why."""


@dataclass(frozen=True)
class Settings:
    port: int
    bind_host: str
    token: str | None
    config_source: str
    log_level: str
    # HTTPS: PEM certificate (chain) and private key files; both or neither.
    tls_cert: str | None = None
    tls_key: str | None = None
    # auto / on / plain-http (TLS_MODES); `serves_tls` says what it comes to.
    tls_mode: str = TLS_AUTO
    # The same as PEM text (a provisioned host's, from the control plane); a secret.
    tls_pem: tuple[str, str] | None = field(default=None, repr=False)
    # The HTTP edge's deadlines and limits (EDGE_SETTINGS).
    edge: EdgeLimits = field(default_factory=lambda: edge_limits_from_env({}))
    adapters: AdapterLimits = field(default_factory=AdapterLimits)

    @property
    def token_weakness(self) -> str | None:
        """Why the token is unfit (common/secret_strength.py), or None: fit, or no token."""
        return secret_weakness(self.token) if self.token is not None else None

    @property
    def token_is_weak(self) -> bool:
        return self.token_weakness is not None

    @property
    def serves_tls(self) -> bool:
        """HTTPS, or plain HTTP: an operator's or provisioned certificate, or `on`, always
        mean HTTPS; `auto` means HTTPS beyond loopback (settings refuse a certificate with
        `plain-http`)."""
        if self.tls_mode == TLS_PLAIN:
            return False
        given = self.tls_cert is not None or self.tls_pem is not None
        return given or self.tls_mode == TLS_ON or not is_loopback(self.bind_host)


def _get(environ: Mapping[str, str], name: str) -> str | None:
    """Read a variable; blank counts as unset."""
    value = environ.get(name)
    return value if value is not None and value.strip() else None


def _integer(environ: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = _get(environ, name)
    if raw is None:
        return default
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise SettingsError(f"{name} must be an integer from {low} to {high}, got {raw!r}")
    return int(text)


def edge_limits_from_env(environ: Mapping[str, str]) -> EdgeLimits:
    """Validate the HTTP edge's variables (EDGE_SETTINGS); unset ones take their defaults."""
    return EdgeLimits.from_settings(
        {key: _integer(environ, *spec) for key, spec in EDGE_SETTINGS.items()}
    )


def settings_from_env(environ: Mapping[str, str]) -> Settings:
    """Validate the variables SupervisorSettings declares (the edge's through
    edge_limits_from_env)."""
    table = SupervisorSettings
    port_raw = _get(environ, table.port.env)
    port = table.port.default
    if port_raw is not None:
        if not port_raw.strip().isdigit() or not 1 <= int(port_raw) <= 65535:
            raise SettingsError(f"PORT must be a port number from 1 to 65535, got {port_raw!r}")
        port = int(port_raw)
    bind_host = (_get(environ, table.bind_host.env) or DEFAULT_BIND).strip()
    token = _get(environ, table.token.env)
    config_source = _get(environ, table.config.env)
    if config_source is None:
        raise SettingsError(
            f"{table.config.env} is required: inline JSON or the path of a JSON file"
        )
    if token is None and not is_loopback(bind_host):
        raise SettingsError(
            f"refusing to listen on {bind_host} without {table.token.env}: the supervisor "
            "controls model servers and trainers; set a token, or bind 127.0.0.1"
        )
    # Beyond loopback the token is all that guards the host's model servers and trainers: a
    # placeholder left from supervisor.env.example, or a short one, stops the supervisor as it
    # stops the control plane (haru.E004). On loopback it stays a warning (local development).
    weakness = secret_weakness(token) if token is not None else None
    if weakness is not None and not is_loopback(bind_host):
        raise SettingsError(
            f"refusing to listen on {bind_host}: {table.token.env} {weakness} "
            "(manage.py supervisor_token <fleet>/<domain> prints this domain's own)"
        )
    tls_cert, tls_key = _tls_files(environ)
    tls_mode, tls_pem = _tls_mode(environ, tls_cert is not None)
    log_level = (_get(environ, table.log_level.env) or "info").strip().lower()
    if log_level not in LOG_LEVELS:
        raise SettingsError(
            f"{table.log_level.env} must be debug, info, warning or error, got {log_level!r}"
        )
    return Settings(
        port=port,
        bind_host=bind_host,
        token=token,
        config_source=config_source,
        log_level=log_level,
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_mode=tls_mode,
        tls_pem=tls_pem,
        edge=edge_limits_from_env(environ),
        adapters=adapter_limits_from_env(environ),
    )


def _tls_files(environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The certificate and key paths: both or neither, each an existing file."""
    cert, key = SupervisorSettings.tls_cert, SupervisorSettings.tls_key
    paths = _get(environ, cert.env), _get(environ, key.env)
    if (paths[0] is None) != (paths[1] is None):
        raise SettingsError(f"{cert.env} and {key.env} go together: set both for HTTPS, or neither")
    for setting, path in zip((cert, key), paths, strict=True):
        if path is not None and not os.path.isfile(path):
            raise SettingsError(f"{setting.env}: no such file: {path}")
    return paths


def _tls_mode(environ: Mapping[str, str], files: bool) -> tuple[str, tuple[str, str] | None]:
    """HARU_SUPERVISOR_TLS, and the inline certificate and key (both or neither, not with the
    files, not with plain HTTP asked for)."""
    table = SupervisorSettings
    mode = (_get(environ, table.tls.env) or TLS_AUTO).strip().lower()
    if mode not in TLS_MODES:
        raise SettingsError(
            f"{table.tls.env} must be {', '.join(TLS_MODES)}, got {mode!r} (plain HTTP beyond "
            f"loopback is only ever {TLS_PLAIN!r}, by that name)"
        )
    cert, key = table.tls_cert_pem, table.tls_key_pem
    cert_pem, key_pem = _get(environ, cert.env), _get(environ, key.env)
    if (cert_pem is None) != (key_pem is None):
        raise SettingsError(f"{cert.env} and {key.env} go together: set both, or neither")
    pem = (cert_pem, key_pem) if cert_pem is not None and key_pem is not None else None
    if pem is not None and files:
        raise SettingsError(
            f"{cert.env} and {table.tls_cert.env} both give a certificate: set one of them"
        )
    if mode == TLS_PLAIN and (pem is not None or files):
        raise SettingsError(
            f"{table.tls.env}={TLS_PLAIN} and a certificate: drop one (a certificate means HTTPS)"
        )
    return mode, pem
