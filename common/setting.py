"""An environment variable declared once: its name, kind, default, bounds, readers and meaning.

Each process declares its variables as a class whose attributes are `Setting`s (the control
plane's in fleets/base/setting_table.py, the supervisor's in supervisor/settings.py), each
through the `Section` it is listed under, which says the docs' heading and the readers once. The
process reads its environment through that class, code reads the values as typed attributes,
and docs/configuration.md is generated from the same classes (haru/setting_docs.py).

A `Setting` is a non-data descriptor: on the class it is the declaration; on an instance whose
`__dict__` holds the loaded values, the value shadows it, so a read is a plain attribute read.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, Required, TypedDict, TypeVar, Unpack, overload

T = TypeVar("T")


class Kind(StrEnum):
    """How a value is written in the environment (and so how it is parsed)."""

    TEXT = "text"
    INTEGER = "integer"
    BOOLEAN = "boolean"
    URL = "URL"
    LIST = "comma-separated list"
    HOSTS = "comma-separated host patterns"
    FILE = "path of an existing file"  # checked at start-up
    PATH = "path"
    CHOICE = "one of"


# The processes that read a variable (the docs' "read by" column).
SERVER = "server"  # manage.py serve: REST API, dashboard, chat proxy (and, without Redis, ticks)
WORKER = "worker"  # Celery worker and beat: reconcile ticks, pruning
COMMANDS = "manage.py"  # the management commands (seed_layout, prune_history, ...)
SUPERVISOR = "supervisor"  # python -m supervisor, on each GPU host
TRAINER = "trainer"  # a training command the supervisor starts
DEMO = "demo"  # python -m haru.demo
SIMULATOR = "simulator"  # the simulated engine and trainer (tests and the demo)
CONTROL_PLANE = (SERVER, WORKER, COMMANDS)


@dataclass(frozen=True, eq=False)
class Setting(Generic[T]):
    """One environment variable. `key` is the attribute it is declared as."""

    env: str
    kind: Kind
    default: T
    doc: str
    area: str
    reads: tuple[str, ...]
    minimum: int | None = None
    maximum: int | None = None
    # URL schemes, or the values a CHOICE accepts.
    choices: tuple[str, ...] = ()
    # How the docs say the default where the value alone does not (computed, or a fallback).
    shown_default: str | None = None
    key: str = ""

    def __set_name__(self, owner: type, name: str) -> None:
        object.__setattr__(self, "key", name)

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Setting[T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object, owner: type | None = None) -> Setting[T] | T:
        if obj is None:
            return self
        # Reached only when the instance's values lack this key (an override that left it out).
        raise AttributeError(f"{type(obj).__name__} has no value for {self.key} ({self.env})")

    def accepts(self) -> str:
        """The values it takes, in words (the docs' "accepts" column)."""
        if self.kind is Kind.INTEGER:
            return f"integer, {self.minimum} to {self.maximum}"
        if self.kind is Kind.URL:
            return f"URL ({', '.join(self.choices)})"
        if self.kind is Kind.CHOICE:
            return ", ".join(self.choices)
        return str(self.kind)

    def default_text(self) -> str:
        """The default in words: `shown_default`, or the value, or "unset"."""
        if self.shown_default is not None:
            return self.shown_default
        if self.default is None or self.default == [] or self.default == ():
            return "unset"
        if isinstance(self.default, bool):
            return "on" if self.default else "off"
        return str(self.default)


def declared(table: type) -> list[Setting[Any]]:
    """The settings a table class declares, in the order written (its base classes' first)."""
    seen: dict[str, Setting[Any]] = {}
    for klass in reversed(table.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, Setting):
                seen[name] = value
    return list(seen.values())


def over(table: type[T], values: dict[str, Any]) -> T:
    """An instance of `table` whose attributes are `values` itself: a read is a dictionary
    lookup, and a change made to `values` in place shows at once."""
    instance = object.__new__(table)
    instance.__dict__ = values
    return instance


class About(TypedDict, total=False):
    """What every declaration says besides its value and bounds."""

    doc: Required[str]
    area: Required[str]
    reads: Required[tuple[str, ...]]
    shown_default: str
    choices: tuple[str, ...]


def integer(env: str, default: int, low: int, high: int, **about: Unpack[About]) -> Setting[int]:
    """An integer in [low, high]."""
    return Setting(env, Kind.INTEGER, default, minimum=low, maximum=high, **about)


def optional_integer(env: str, low: int, high: int, **about: Unpack[About]) -> Setting[int | None]:
    """An integer in [low, high], or None when unset."""
    return Setting[int | None](env, Kind.INTEGER, None, minimum=low, maximum=high, **about)


def text(env: str, kind: Kind = Kind.TEXT, **about: Unpack[About]) -> Setting[str | None]:
    """A string (a token, a name, a path, a URL: `kind` says which), or None when unset."""
    return Setting[str | None](env, kind, None, **about)


def flag(env: str, default: bool, **about: Unpack[About]) -> Setting[bool]:
    """A boolean: 1/0, true/false, yes/no, on/off."""
    return Setting(env, Kind.BOOLEAN, default, **about)


def listing(env: str, **about: Unpack[About]) -> Setting[list[str]]:
    """Comma-separated items; an empty list when unset."""
    return Setting[list[str]](env, Kind.LIST, [], **about)


def host_patterns(env: str, **about: Unpack[About]) -> Setting[tuple[str, ...]]:
    """Comma-separated host globs or CIDR networks; empty when unset."""
    return Setting[tuple[str, ...]](env, Kind.HOSTS, (), **about)


class Words(TypedDict, total=False):
    """What a declaration in a `Section` says besides its value and bounds."""

    doc: Required[str]
    shown_default: str
    choices: tuple[str, ...]
    # Where a variable's readers are not its section's.
    reads: tuple[str, ...]


@dataclass(frozen=True)
class Section:
    """Variables under one heading of the docs, read by the same processes unless one says
    otherwise: the heading and the readers are written once, not on every declaration."""

    area: str
    reads: tuple[str, ...]

    def _about(self, words: Words) -> About:
        return {"area": self.area, "reads": self.reads, **words}

    def integer(
        self, env: str, default: int, low: int, high: int, **words: Unpack[Words]
    ) -> Setting[int]:
        """An integer in [low, high]."""
        return integer(env, default, low, high, **self._about(words))

    def optional_integer(
        self, env: str, low: int, high: int, **words: Unpack[Words]
    ) -> Setting[int | None]:
        """An integer in [low, high], or None when unset."""
        return optional_integer(env, low, high, **self._about(words))

    def text(self, env: str, kind: Kind = Kind.TEXT, **words: Unpack[Words]) -> Setting[str | None]:
        """A string (`kind` says which), or None when unset."""
        return text(env, kind, **self._about(words))

    def flag(self, env: str, default: bool, **words: Unpack[Words]) -> Setting[bool]:
        """A boolean: 1/0, true/false, yes/no, on/off."""
        return flag(env, default, **self._about(words))

    def listing(self, env: str, **words: Unpack[Words]) -> Setting[list[str]]:
        """Comma-separated items; an empty list when unset."""
        return listing(env, **self._about(words))

    def host_patterns(self, env: str, **words: Unpack[Words]) -> Setting[tuple[str, ...]]:
        """Comma-separated host globs or CIDR networks; empty when unset."""
        return host_patterns(env, **self._about(words))
