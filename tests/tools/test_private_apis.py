"""The private interfaces of dependencies, checked against the installed versions.

Each entry of `RELIED_ON` (common/private_apis.py, fleets/base/private_apis.py) says what of a
dependency's private interface Haru relies on; an upgrade that moves it fails here, naming the
dependency, the installed version and what changed, before it fails somewhere far away (a
lost deadline, a chat path that never answers). docs/private-apis.md lists the same entries.
"""

from __future__ import annotations

import importlib
import inspect
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from common import private_apis as shared
from common.private_apis import Reliance
from fleets.base import private_apis as server

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = {ROOT / "common" / "private_apis.py", ROOT / "fleets" / "base" / "private_apis.py"}
RELIED_ON = [*shared.RELIED_ON, *server.RELIED_ON]

# Spelled only in the adapters: a private module of a dependency, or a private name of one.
PRIVATE_SPELLINGS = (
    "httptools_impl",
    "uvicorn.protocols.utils",
    "flow_control",
    "_captured_signals",
    "multiprocess.Process",
    "transport._pool",
    "_WaitTimeout",
    "_has_been_logged",
    "request._request",
    "UnpooledDatabaseWrapper",
    "._upper_bounds",
    "._buckets",
    "._map_serializer",
)


def _source_file(obj: Any) -> str | None:
    """The file that defines `obj` (httpx renames its classes' __module__, so not by module)."""
    if inspect.isclass(obj):
        for member in vars(obj).values():
            code = getattr(member, "__code__", None) or getattr(
                getattr(member, "fget", None), "__code__", None
            )
            if code is not None:
                return code.co_filename
        return None
    code = getattr(obj, "__code__", None)
    return code.co_filename if code is not None else None


def problems(reliance: Reliance) -> list[str]:
    """What of `reliance` the installed dependency no longer has, each naming all of it."""
    try:
        version = metadata.version(reliance.dependency)
    except metadata.PackageNotFoundError:
        return [f"{reliance.dependency} is not installed (used by {reliance.used_by})"]
    where = f"{reliance.dependency} {version}: {reliance.target}"
    module_name, _, qualname = reliance.target.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        return [f"{where}: the module is gone ({exc}); used by {reliance.used_by}"]
    for part in qualname.split("."):
        if not hasattr(target, part):
            return [f"{where}: `{part}` is gone; used by {reliance.used_by}"]
        target = getattr(target, part)
    found = []
    for method, expected in reliance.parameters.items():
        function = target if method == "" else getattr(target, method, None)
        name = qualname if method == "" else f"{qualname}.{method}"
        if function is None:
            found.append(f"{where}: `{name}` is gone; used by {reliance.used_by}")
            continue
        actual = [p for p in inspect.signature(function).parameters if p != "self"]
        missing = [p for p in expected if p not in actual]
        in_order = [p for p in actual if p in expected]
        if missing or in_order != list(expected):
            found.append(
                f"{where}: `{name}` takes ({', '.join(actual)}), Haru relies on "
                f"({', '.join(expected)}); used by {reliance.used_by}"
            )
    if reliance.source:
        path = _source_file(target)
        text = Path(path).read_text() if path else ""
        for fragment in reliance.source:
            if fragment not in text:
                found.append(
                    f"{where}: its source no longer has `{fragment}`; used by {reliance.used_by}"
                )
    return found


@pytest.mark.parametrize("reliance", RELIED_ON, ids=lambda r: f"{r.dependency}-{r.target}")
def test_each_private_interface_is_still_there(reliance):
    assert problems(reliance) == []


def test_a_changed_interface_is_reported_by_dependency_version_and_name():
    version = metadata.version("uvicorn")
    renamed = Reliance(
        "uvicorn", "uvicorn.server:Server", "a test", parameters={"handle_exit": ("signum",)}
    )
    assert problems(renamed) == [
        f"uvicorn {version}: uvicorn.server:Server: `Server.handle_exit` takes (sig, frame), "
        "Haru relies on (signum); used by a test"
    ]
    gone = Reliance("uvicorn", "uvicorn.server:Server.no_such_thing", "a test")
    assert problems(gone) == [
        f"uvicorn {version}: uvicorn.server:Server.no_such_thing: `no_such_thing` is gone; "
        "used by a test"
    ]
    moved = Reliance("httpx", "httpx:HTTPTransport", "a test", source=("self._no_such_pool",))
    assert problems(moved) == [
        f"httpx {metadata.version('httpx')}: httpx:HTTPTransport: its source no longer has "
        "`self._no_such_pool`; used by a test"
    ]


def test_the_private_names_are_spelled_only_in_the_adapters():
    spelled = []
    for package in ("common", "fleets", "supervisor", "haru", "bench"):
        for path in (ROOT / package).rglob("*.py"):
            if path in ADAPTERS:
                continue
            text = path.read_text()
            spelled += [f"{path.relative_to(ROOT)}: {s}" for s in PRIVATE_SPELLINGS if s in text]
    assert spelled == []


def test_every_entry_is_in_the_docs():
    doc = (ROOT / "docs" / "private-apis.md").read_text()
    assert [r.target for r in RELIED_ON if f"`{r.target}`" not in doc] == []
