"""Print the structure map's size: rooms, arrows and import circles.

A room is a group of the layer table in tests/tools/test_import_layers.py (a layer folder, or
one of the app-root modules Django and Celery look for by name); an arrow is an import from one
room into another; a circle is a strongly connected set of modules. Every import counts,
including those under `if TYPE_CHECKING:` and inside functions.

    .venv/bin/python tools/structure_map.py [REPO]     (default: this checkout)
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path


def _imports(name: str, path: Path):
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            yield module, tuple(alias.name for alias in node.names)


def _circles(edges: dict[str, frozenset[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's strongly connected components
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
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(edges):
        if node not in index:
            connect(node)
    return found


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
    spec = importlib.util.spec_from_file_location(
        "layers", root / "tests" / "tools" / "test_import_layers.py"
    )
    assert spec is not None and spec.loader is not None
    layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layers)
    layers.ROOT = root
    layers._imported_names = _imports  # every import, TYPE_CHECKING ones included
    layers.modules.cache_clear()
    layers.graph.cache_clear()
    graph = layers.graph()
    rooms, arrows = set(), set()
    for module, targets in graph.items():
        if module in layers.PACKAGES:
            continue
        room = layers.layer_of(module)[1]
        rooms.add(room)
        arrows.update((room, layers.layer_of(t)[1]) for t in targets)
    arrows = {(a, b) for a, b in arrows if a != b}
    circles = _circles(graph)
    print(f"rooms {len(rooms)}  arrows {len(arrows)}  circles {len(circles)}")
    for circle in circles:
        print("  circle: " + " <-> ".join(circle))


if __name__ == "__main__":
    main()
