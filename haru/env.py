"""Read and validate configuration from environment variables.

Every reader names the variable in its error, so a malformed value stops start-up with a message
an operator can act on. A blank value counts as unset, as in the original server.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

from common.setting import Kind, Setting
from fleets.core.urls import HostPatternError, parse_host_patterns

T = TypeVar("T")


class ConfigError(Exception):
    """A malformed environment variable."""


def raw(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """Return the stripped value of `name`, or None when unset or blank."""
    value = (env if env is not None else os.environ).get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def integer(
    name: str,
    default: int | None,
    *,
    minimum: int = 0,
    maximum: int = 2**31 - 1,
    env: Mapping[str, str] | None = None,
) -> int | None:
    """Return `name` as an integer in [minimum, maximum], or `default` when unset."""
    value = raw(name, env)
    if value is None:
        return default
    try:
        number = int(value, 10)
    except ValueError:
        raise ConfigError(f"{name}: must be an integer, got {value!r}") from None
    if not minimum <= number <= maximum:
        raise ConfigError(f"{name}: must be between {minimum} and {maximum}, got {number}")
    return number


def boolean(name: str, default: bool, env: Mapping[str, str] | None = None) -> bool:
    """Return `name` as a boolean (1/0, true/false, yes/no, on/off)."""
    value = raw(name, env)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name}: must be a boolean (true/false), got {value!r}")


def url(name: str, schemes: tuple[str, ...], env: Mapping[str, str] | None = None) -> str | None:
    """Return `name` when it is a URL with one of `schemes` and a host (or a path for sqlite)."""
    value = raw(name, env)
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in schemes:
        raise ConfigError(
            f"{name}: scheme must be one of {', '.join(schemes)}, got {parts.scheme or 'none'!r}"
        )
    try:
        parts.port  # noqa: B018 - urlsplit parses the port lazily and raises here
    except ValueError:
        raise ConfigError(f"{name}: port must be a number between 0 and 65535") from None
    is_postgres = parts.scheme.startswith("postgres")
    # libpq reaches a local server through its Unix socket when the host is left out
    # (postgres:///haru), so only non-Postgres network URLs must name a host.
    if not parts.scheme.startswith("sqlite") and not is_postgres and not parts.hostname:
        raise ConfigError(f"{name}: must name a host")
    if is_postgres and not parts.path.strip("/"):
        raise ConfigError(f"{name}: must name a database (postgres://host/DBNAME)")
    return value


def csv(name: str, env: Mapping[str, str] | None = None) -> list[str]:
    """Return `name` as a list of non-empty comma-separated items."""
    value = raw(name, env)
    if value is None:
        return []
    return [item.strip() for item in value.split(",") if item.strip()]


def redact_url(value: str) -> str:
    """Return `value` with any password replaced, fit for a log line."""
    parts = urlsplit(value)
    if parts.password is None:
        return value
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return parts._replace(netloc=netloc).geturl()


def host_patterns(name: str, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Return `name` as host allow-list patterns (globs or CIDR networks), comma-separated."""
    try:
        return parse_host_patterns(csv(name, env))
    except HostPatternError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def existing_file(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """Return `name` when it names a readable file (a CA bundle: a typo must stop start-up,
    not silently fall back to another trust store)."""
    value = raw(name, env)
    if value is None:
        return None
    if not Path(value).is_file():
        raise ConfigError(f"{name}: no such file: {value}")
    return value


def read(
    setting: Setting[T], env: Mapping[str, str] | None = None, *, default: T | None = None
) -> T:
    """Return the value of a declared setting (common/setting.py), parsed as its kind says;
    `default` replaces the declared one where it is computed from other settings."""
    name = setting.env
    fallback = setting.default if default is None else default
    value: Any
    if setting.kind is Kind.INTEGER:
        low, high = setting.minimum, setting.maximum
        assert low is not None and high is not None  # an INTEGER declaration has both
        value = integer(name, cast("int | None", fallback), minimum=low, maximum=high, env=env)
    elif setting.kind is Kind.BOOLEAN:
        value = boolean(name, cast(bool, fallback), env)
    elif setting.kind is Kind.URL:
        value = url(name, setting.choices, env)
    elif setting.kind is Kind.LIST:
        value = csv(name, env)
    elif setting.kind is Kind.HOSTS:
        value = host_patterns(name, env)
    elif setting.kind is Kind.FILE:
        value = existing_file(name, env)
    else:
        value = raw(name, env)
    return cast(T, value)
