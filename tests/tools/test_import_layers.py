"""The layer table of docs/architecture.md, checked against every module's imports.

Imports point down the layers; an arrow up, or a circle, is a bug a reader cannot see from one
file. Every `import` and `from ... import` in the shipped packages counts, at module level,
inside a function or under `if TYPE_CHECKING:` (a name for annotations only is still an arrow
a reader follows: where one side only needs a shape, it declares a `typing.Protocol`).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "fleets", "supervisor", "haru")

# Rank of each layer, bottom first; a module may import modules of its own rank or below. Each
# layer is a folder (or, for Django's and Celery's own file names, a module at the app's root).
# Entry points are the top and are further limited to their own folder (see ENTRY_CROSSINGS).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("shared", ("common",)),
    ("supervisor", ("supervisor",)),
    ("core", ("fleets.core",)),
    ("bottom", ("fleets.base", "fleets.drivers")),
    ("documents and storage", ("fleets.layouts", "fleets.models")),
    ("reads", ("fleets.reads",)),
    ("writes", ("fleets.services",)),
    ("metrics", ("fleets.metrics",)),
    ("reconciler", ("fleets.reconciler",)),
    (
        "entry points",
        (
            "fleets.api",
            "fleets.dashboard",
            "fleets.admin",
            "fleets.live",
            "fleets.tasks",
            "fleets.management",
            "fleets.proxy",
            "fleets.server",
            "fleets.apps",
            "fleets.checks",
            "haru",
        ),
    ),
]
# Entry points do not import each other, except where one is the other's engine on purpose.
ENTRY_CROSSINGS = {
    ("fleets.admin", "fleets.dashboard"),  # admin actions call the dashboard's own actions
    ("fleets.server", "fleets.proxy"),  # the direct chat path runs the proxy's flow
    ("fleets.server", "fleets.tasks"),  # the tick driver kicks through the Celery tasks
    ("fleets.management", "fleets.server"),  # `serve` starts the server and its driver
    ("fleets.management", "fleets.proxy"),  # `serve` drains the proxy on SIGTERM
    ("fleets.apps", "fleets.api"),  # the app config registers the OpenAPI extension
    ("fleets.apps", "fleets.checks"),  # ... and the system checks
}
# The control plane reaches into the agent only through these named doors: the fingerprint a
# layout's engine profile would get (the dashboard's drift check), and the supervisor's config
# and state records (a provisioned domain carries a config; the local launcher writes one), and
# its declared settings (docs/configuration.md is generated from both processes' tables).
SUPERVISOR_DOORS = {
    "supervisor.config",
    "supervisor.engines.drift",
    "supervisor.records",
    "supervisor.settings",
}
# What the pure core may import beyond itself and the standard library.
# (common.wire.codec: the dataclass <-> camelCase JSON codec, standard library only;
# common.tls_pin: a certificate's SHA-256 pin, common.loopback: whether an address is loopback,
# both standard library only; common.adapter_manifest: the trainer's manifest and an adapter
# version's engine name, standard library only.)
CORE_MAY_IMPORT = {
    "common.adapter_manifest",
    "common.limits",
    "common.documents",
    "common.strict_json",
    "common.wire.codec",
    "common.tls_pin",
    "common.loopback",
}
# The drivers render and call their tools: beyond themselves, only the shared schema checker
# (and the TLS identity a launch ships, as a value: common.tls_pin, standard library only).
DRIVERS_MAY_IMPORT = {"common.documents", "common.strict_json", "common.limits", "common.tls_pin"}
# The chat proxy reaches the control plane at these points only (docs/architecture.md); the
# core's pure rules (route intent, the read model, states) it may read as any layer may.
PROXY_MAY_IMPORT = {
    "fleets.reconciler.datapath",
    "fleets.services.route_publish",
    "fleets.models",
    "fleets.base.conf",
    "fleets.base.tokens",
    "fleets.base.clock",
    "fleets.base.errors",
    "fleets.metrics.registry",
    "fleets.metrics.requests",
    "fleets.base.continuation_series",  # the stream-continuation series' names
    "fleets.metrics.continuations",  # the stream-continuation series
    "fleets.metrics.arms",  # a split's per-arm series
    "fleets.services.arm_samples",  # the per-arm samples' one write a second (the gates' input)
    "common.wire.bounded_json",
    "common.wire",
    "common.private_apis",  # the drain's hold on uvicorn's server and worker processes
    "fleets.base.private_apis",  # the data path's connection outside Django's pool
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" not in path.parts:
                found[_module_name(path)] = path
    return found


def _imported_names(name: str, path: Path) -> Iterator[tuple[str, tuple[str, ...]]]:
    """Yield (module, names): `import a.b` is ("a.b", ()), `from a import b` is ("a", ("b",))."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]

    def visit(node: ast.AST) -> Iterator[tuple[str, tuple[str, ...]]]:
        if isinstance(node, ast.Import):
            yield from ((alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield module, tuple(alias.name for alias in node.names)
        for child in ast.iter_child_nodes(node):
            yield from visit(child)

    yield from visit(ast.parse(path.read_text()))


@cache
def graph() -> dict[str, frozenset[str]]:
    """Module -> the shipped modules it imports (the longest module a dotted name names)."""
    known = modules()

    def resolve(dotted: str) -> str | None:
        parts = dotted.split(".")
        while parts:
            candidate = ".".join(parts)
            if candidate in known:
                return candidate
            parts.pop()
        return None

    edges = {}
    for name, path in known.items():
        targets = set()
        for module, names in _imported_names(name, path):
            # `from fleets.reconciler import datapath` imports the module datapath; a name
            # that is no module (a function, a class) is an edge to the module it lives in.
            submodules = [f"{module}.{n}" for n in names if f"{module}.{n}" in known]
            if len(submodules) < len(names) or not names:
                targets.add(resolve(module))
            targets.update(submodules)
        # A package's own __init__ (the top of a package, or this module's parent) is no edge.
        edges[name] = frozenset(
            t
            for t in targets
            if t and t != name and t not in PACKAGES and not name.startswith(f"{t}.")
        )
    return edges


def third_party(name: str) -> set[str]:
    roots = {module.split(".")[0] for module, _ in _imported_names(name, modules()[name])}
    return {r for r in roots if r and r not in sys.stdlib_module_names and r not in PACKAGES}


def _group(module: str, prefixes: tuple[str, ...]) -> str | None:
    return next((p for p in prefixes if module == p or module.startswith(f"{p}.")), None)


def layer_of(module: str) -> tuple[int, str]:
    for rank, (_, prefixes) in enumerate(LAYERS):
        group = _group(module, prefixes)
        if group is not None:
            return rank, group
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and docs/architecture.md")


def test_every_module_has_a_layer():
    for module in modules():
        if module not in PACKAGES:
            layer_of(module)


def test_imports_point_down_the_layers():
    entry = len(LAYERS) - 1
    wrong = []
    for module, targets in sorted(graph().items()):
        if module in PACKAGES:
            continue
        rank, group = layer_of(module)
        for target in sorted(targets):
            target_rank, target_group = layer_of(target)
            if target_rank > rank:
                wrong.append(
                    f"{module} -> {target} (up: {LAYERS[rank][0]} -> {LAYERS[target_rank][0]})"
                )
            elif (
                rank == entry
                and target_rank == entry
                and group != target_group
                and (group, target_group) not in ENTRY_CROSSINGS
                and not group.startswith("haru")
            ):
                wrong.append(f"{module} -> {target} (one entry point into another)")
    assert wrong == []


def import_circles(edges: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(edges):
        if node not in index:
            connect(node)
    return circles


def test_there_are_no_import_circles():
    assert import_circles(graph()) == []


def test_the_supervisor_stands_alone():
    """It runs on GPU hosts without Django or the control plane: itself and `common` only."""
    for module, targets in graph().items():
        if module.startswith(("supervisor", "common")):
            own = ("supervisor", "common") if module.startswith("supervisor") else ("common",)
            assert not [t for t in targets if not t.startswith(own)], module
            assert "django" not in third_party(module), module


def test_the_control_plane_enters_the_agent_only_through_its_doors():
    for module, targets in graph().items():
        if module.startswith(("fleets", "haru")):
            inside = {t for t in targets if t.startswith("supervisor")}
            assert inside - SUPERVISOR_DOORS == set(), module


def test_layers_are_folders():
    """`ls fleets/` says the layers: every module lies in a layer's folder, or is one of the
    files Django and Celery look for by name at the app's root."""
    loose = {
        path.name
        for path in (ROOT / "fleets").glob("*.py")
        if path.name not in {"__init__.py", "apps.py", "models.py", "tasks.py", "checks.py"}
    }
    assert loose == set()


def test_the_core_is_pure():
    for module, targets in graph().items():
        if module.startswith("fleets.core"):
            outside = {t for t in targets if not t.startswith("fleets.core")} - CORE_MAY_IMPORT
            assert outside == set(), module
            # jsonschema only through common.documents; nothing else from outside.
            assert third_party(module) == set(), module


@pytest.mark.parametrize(
    ("package", "allowed", "core"),
    [("fleets.drivers", DRIVERS_MAY_IMPORT, False), ("fleets.proxy", PROXY_MAY_IMPORT, True)],
)
def test_packages_with_a_narrow_door_use_only_it(package, allowed, core):
    for module, targets in graph().items():
        if module.startswith(package):
            outside = {t for t in targets if not t.startswith(package)}
            if core:
                outside = {t for t in outside if not t.startswith("fleets.core.")}
            assert outside - allowed == set(), module


def test_the_checker_sees_an_arrow_up():
    """The check itself works: a services module importing the API would be reported."""
    assert layer_of("fleets.services.operations")[0] < layer_of("fleets.api.views")[0]
    assert "fleets.services.operations" in graph()["fleets.api.views"]


def test_the_checker_counts_imports_for_annotations_only(tmp_path):
    """An import under `if TYPE_CHECKING:` is an arrow too (a Protocol avoids one)."""
    source = tmp_path / "module.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from fleets.models import Slot\n"
        "else:\n"
        "    import fleets.base.clock\n"
    )
    imported = set(_imported_names("fleets.services.example", source))
    assert ("fleets.models", ("Slot",)) in imported
    assert ("fleets.base.clock", ()) in imported
