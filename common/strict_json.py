"""JSON value kinds and the refused-document error.

Two integer rules, each written once here. Operator documents (the supervisor config, engine
profiles, layouts, policies), checked through `common/documents.py`, take "an int but not a bool"
(`is_int`): a hand-written `4.0` there is a slip worth naming. The supervisor wire (every request
and answer body, `common/wire/`) takes a number with no fractional part (`is_whole`), as JSON
Schema's `integer` and the original TypeScript system do (JavaScript has one number type, so its
`4` may arrive as `4.0`); whoever reads it then holds an int (`whole_int`).
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard


class ConfigError(Exception):
    """Refuse a document; holds every `path: rule` message found, not just the first."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        super().__init__("; ".join(self.errors))

    def render(self) -> str:
        """Format the errors one per line for a terminal."""
        return "\n".join(f"  - {e}" for e in self.errors)


def is_int(value: Any) -> TypeGuard[int]:
    """Accept JSON integers only; `true` is not 1 here."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_whole(value: Any) -> bool:
    """The wire's integer: a finite number (never a boolean) with no fractional part."""
    return is_int(value) or (isinstance(value, float) and value.is_integer())


def whole_int(value: Any) -> int | None:
    """The wire's integer as an int (`4.0` reads as `4`), or None for anything else."""
    return int(value) if is_whole(value) else None


def is_number(value: Any) -> TypeGuard[int | float]:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def type_name(value: Any) -> str:
    """Name a JSON value's type the way an operator reads it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
