"""The supervisor's environment variables, validated with clear errors."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from common.edge.limits import EdgeLimits

DEFAULT_PORT = 8701
DEFAULT_BIND = "127.0.0.1"
MIN_TOKEN_LENGTH = 16

# The HTTP edge (common/edge/protocol.py): (variable, default, minimum, maximum). The
# supervisor listens beyond loopback when the control plane is on another host, and the header
# phase comes before the token check, so each bound holds for unauthenticated clients too. Its
# callers are a few control-plane processes sending small requests: tighter than the control
# plane's own edge (HARU_HTTP_*), which also serves chat clients.
EDGE_SETTINGS: dict[str, tuple[str, int, int, int]] = {
    "header_timeout_ms": ("HARU_SUPERVISOR_HTTP_HEADER_TIMEOUT_MS", 10_000, 100, 600_000),
    "body_timeout_ms": ("HARU_SUPERVISOR_HTTP_BODY_TIMEOUT_MS", 10_000, 100, 3_600_000),
    "keepalive_timeout_ms": ("HARU_SUPERVISOR_HTTP_KEEPALIVE_TIMEOUT_MS", 5_000, 100, 3_600_000),
    "max_header_bytes": ("HARU_SUPERVISOR_HTTP_MAX_HEADER_BYTES", 16_384, 4_096, 16 * 1024**2),
    "max_headers": ("HARU_SUPERVISOR_HTTP_MAX_HEADERS", 64, 16, 10_000),
    # At least the API's own cap on a control body (supervisor/api.py MAX_BODY_BYTES), whose
    # finer refusal answers first below this one.
    "max_body_bytes": ("HARU_SUPERVISOR_HTTP_MAX_BODY_BYTES", 1024**2, 64 * 1024, 2**30),
    "max_connections": ("HARU_SUPERVISOR_HTTP_MAX_CONNECTIONS", 256, 8, 1_000_000),
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
    # HTTPS: PEM certificate (chain) and private key; both or neither.
    tls_cert: str | None = None
    tls_key: str | None = None
    # The HTTP edge's deadlines and limits (EDGE_SETTINGS).
    edge: EdgeLimits = field(default_factory=lambda: edge_limits_from_env({}))

    @property
    def token_is_weak(self) -> bool:
        return self.token is not None and len(self.token) < MIN_TOKEN_LENGTH


def _get(environ: Mapping[str, str], name: str) -> str | None:
    """Read a variable; blank counts as unset."""
    value = environ.get(name)
    return value if value is not None and value.strip() else None


def is_loopback(host: str) -> bool:
    """Tell whether a bind address only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        # A hostname could resolve anywhere; only the literal loopback forms count.
        return False


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
    """Validate PORT, HARU_SUPERVISOR_HOST, _TOKEN, _CONFIG, _TLS_CERT/_KEY, _LOG_LEVEL and the
    HTTP edge's HARU_SUPERVISOR_HTTP_* variables."""
    port_raw = _get(environ, "PORT")
    port = DEFAULT_PORT
    if port_raw is not None:
        if not port_raw.strip().isdigit() or not 1 <= int(port_raw) <= 65535:
            raise SettingsError(f"PORT must be a port number from 1 to 65535, got {port_raw!r}")
        port = int(port_raw)
    bind_host = (_get(environ, "HARU_SUPERVISOR_HOST") or DEFAULT_BIND).strip()
    token = _get(environ, "HARU_SUPERVISOR_TOKEN")
    config_source = _get(environ, "HARU_SUPERVISOR_CONFIG")
    if config_source is None:
        raise SettingsError(
            "HARU_SUPERVISOR_CONFIG is required: inline JSON or the path of a JSON file"
        )
    if token is None and not is_loopback(bind_host):
        raise SettingsError(
            f"refusing to listen on {bind_host} without HARU_SUPERVISOR_TOKEN: the supervisor "
            "controls model servers and trainers; set a token, or bind 127.0.0.1"
        )
    tls_cert = _get(environ, "HARU_SUPERVISOR_TLS_CERT")
    tls_key = _get(environ, "HARU_SUPERVISOR_TLS_KEY")
    if (tls_cert is None) != (tls_key is None):
        raise SettingsError(
            "HARU_SUPERVISOR_TLS_CERT and HARU_SUPERVISOR_TLS_KEY go together: set both for "
            "HTTPS, or neither"
        )
    for name, path in (
        ("HARU_SUPERVISOR_TLS_CERT", tls_cert),
        ("HARU_SUPERVISOR_TLS_KEY", tls_key),
    ):
        if path is not None and not os.path.isfile(path):
            raise SettingsError(f"{name}: no such file: {path}")
    log_level = (_get(environ, "HARU_SUPERVISOR_LOG_LEVEL") or "info").strip().lower()
    if log_level not in ("debug", "info", "warning", "error"):
        raise SettingsError(
            f"HARU_SUPERVISOR_LOG_LEVEL must be debug, info, warning or error, got {log_level!r}"
        )
    return Settings(
        port=port,
        bind_host=bind_host,
        token=token,
        config_source=config_source,
        log_level=log_level,
        tls_cert=tls_cert,
        tls_key=tls_key,
        edge=edge_limits_from_env(environ),
    )
