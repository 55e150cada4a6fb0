"""Print the structure map's size: rooms, arrows and import circles.

A room is a group of the layer table in tests/tools/test_import_layers.py (a layer folder, or
one of the app-root modules Django and Celery look for by name); an arrow is an import from one
room into another; a circle is a strongly connected set of modules. The graph is the layer
test's own: every import counts, including those under `if TYPE_CHECKING:` and inside
functions.

    .venv/bin/python tools/structure_map.py [REPO]     (default: this checkout)
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
    spec = importlib.util.spec_from_file_location(
        "layers", root / "tests" / "tools" / "test_import_layers.py"
    )
    assert spec is not None and spec.loader is not None
    layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layers)
    layers.ROOT = root
    graph = layers.graph()
    rooms, arrows = set(), set()
    for module, targets in graph.items():
        if module in layers.PACKAGES:
            continue
        room = layers.layer_of(module)[1]
        rooms.add(room)
        arrows.update((room, layers.layer_of(t)[1]) for t in targets)
    arrows = {(a, b) for a, b in arrows if a != b}
    circles = layers.import_circles(graph)
    print(f"rooms {len(rooms)}  arrows {len(arrows)}  circles {len(circles)}")
    for circle in circles:
        print("  circle: " + " <-> ".join(circle))


if __name__ == "__main__":
    main()
