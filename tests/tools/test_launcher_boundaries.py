"""One local launcher (haru/local/): the benchmarks stand on it, not on the tests, and one
module probes ports.

A benchmark that imports `tests` runs only from a checkout with the test suite's fixtures and
doubles importable, and a change to a test helper silently changes a published figure. A port
probe written again elsewhere drifts from the one that knows about the ephemeral range (a
probe of port 0 hands out a port the kernel may give the next outgoing connection).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PORTS = ROOT / "haru" / "local" / "ports.py"


def _python_files(*folders: str) -> Iterator[Path]:
    for folder in folders:
        yield from sorted((ROOT / folder).rglob("*.py"))


def imports_of_tests(path: Path) -> list[str]:
    """Return the `tests` modules `path` imports (at any depth, in any function)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "tests"]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found += [node.module] if node.module.split(".")[0] == "tests" else []
    return found


def port_probes(path: Path) -> list[int]:
    """Return the lines where `path` binds a socket it opened in a `with` and never listens on
    (a probe: "is this port free", or "give me a port" by binding port 0)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.With):
            continue
        sockets = {
            item.optional_vars.id
            for item in node.items
            if isinstance(item.optional_vars, ast.Name)
            and isinstance(item.context_expr, ast.Call)
            and ast.unparse(item.context_expr.func) in ("socket.socket", "socket")
        }
        called = {
            call.func.attr
            for statement in node.body
            for call in ast.walk(statement)
            if isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Name)
            and call.func.value.id in sockets
        }
        if "bind" in called and "listen" not in called:
            lines.append(node.lineno)
    return lines


def test_the_benchmarks_import_nothing_from_the_tests():
    offenders = {
        str(path.relative_to(ROOT)): modules
        for path in _python_files("bench")
        if (modules := imports_of_tests(path))
    }
    assert offenders == {}, "bench/ imports tests/: move what it needs into haru/local/ or bench/"


def test_only_the_launchers_ports_module_probes_a_port():
    offenders = {
        str(path.relative_to(ROOT)): lines
        for path in _python_files("tests", "bench", "haru")
        if path != PORTS and (lines := port_probes(path))
    }
    assert offenders == {}, "probe ports with haru.local.ports (free_port, port_free) instead"
    assert port_probes(PORTS), "the probe itself moved: point PORTS at it"


def test_the_scans_see_what_they_look_for(tmp_path):
    """The two scans find an import of tests and both kinds of probe (they must be able to
    fail)."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import socket\n"
        "import tests.ports\n"
        "def f():\n"
        "    from tests.e2e import harness\n"
        "    with socket.socket() as s:\n"
        "        s.bind(('127.0.0.1', 0))\n"
        "        return s.getsockname()[1]\n"
        "def g(port):\n"
        "    with socket.socket() as s:\n"
        "        s.bind(('127.0.0.1', port))\n"
        "def server():\n"
        "    with socket.socket() as s:\n"
        "        s.bind(('127.0.0.1', 0))\n"
        "        s.listen()\n"
    )
    assert imports_of_tests(sample) == ["tests.ports", "tests.e2e"]
    assert port_probes(sample) == [5, 9]
