"""The supervisor's environment variables, validated with clear errors."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_PORT = 8701
DEFAULT_BIND = "127.0.0.1"
MIN_TOKEN_LENGTH = 16


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


def settings_from_env(environ: Mapping[str, str]) -> Settings:
    """Validate PORT, HARU_SUPERVISOR_HOST, _TOKEN, _CONFIG, _TLS_CERT/_KEY and _LOG_LEVEL."""
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
    )
