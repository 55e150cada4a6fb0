"""Secrets named by reference in the supervisor config: an environment variable or a file.

The config never holds a key itself, so it can be logged, diffed and shipped; the value is read
when first needed and lives only in memory. `SecretRef` renders as its reference, never its
value, so a log line or a status body that prints one leaks nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

MAX_SECRET_BYTES = 4096


class SecretUnavailable(Exception):
    """The referenced variable is unset or the file cannot be read; the message names only
    the reference."""


@dataclass(frozen=True)
class SecretRef:
    """`{"env": NAME}` or `{"file": PATH}` from the config."""

    env: str | None = None
    file: Path | None = None
    _environ: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def describe(self) -> str:
        return f"env {self.env}" if self.env else f"file {self.file}"

    def __repr__(self) -> str:
        return f"SecretRef({self.describe()})"

    __str__ = __repr__

    def read(self, environ: Mapping[str, str]) -> str:
        """Return the secret, stripped of surrounding whitespace; raise SecretUnavailable."""
        if self.env:
            value = environ.get(self.env, "").strip()
            if not value:
                raise SecretUnavailable(f"environment variable {self.env} is unset or empty")
            return value
        assert self.file is not None
        try:
            data = self.file.read_bytes()[: MAX_SECRET_BYTES + 1]
        except OSError as exc:
            raise SecretUnavailable(f"cannot read {self.file}: {exc.strerror}") from exc
        if len(data) > MAX_SECRET_BYTES:
            raise SecretUnavailable(f"{self.file} is larger than {MAX_SECRET_BYTES} bytes")
        value = data.decode("utf-8", errors="replace").strip()
        if not value:
            raise SecretUnavailable(f"{self.file} is empty")
        return value
