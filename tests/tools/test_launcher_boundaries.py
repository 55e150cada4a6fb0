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
PORTS = ROOT / "common" / "ports.py"


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


def _socket_calls(body: list[ast.stmt], names: set[str]) -> dict[str, list[ast.Call]]:
    """Method name -> the calls of it on the sockets `names` within `body`."""
    calls: dict[str, list[ast.Call]] = {}
    for statement in body:
        for call in ast.walk(statement):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Name)
                and call.func.value.id in names
            ):
                calls.setdefault(call.func.attr, []).append(call)
    return calls


def _binds_port_zero(call: ast.Call) -> bool:
    address = call.args[0] if call.args else None
    return (
        isinstance(address, ast.Tuple)
        and len(address.elts) == 2
        and isinstance(address.elts[1], ast.Constant)
        and address.elts[1].value == 0
    )


def port_probes(path: Path) -> list[int]:
    """Return the lines where `path` probes a port: binds a socket it never listens on, either
    opened in a `with` ("is this port free") or a local one bound to port 0 ("give me a
    port"). A socket that connects is a client choosing its source address, not a probe."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.With):
            sockets = {
                item.optional_vars.id
                for item in node.items
                if isinstance(item.optional_vars, ast.Name)
                and isinstance(item.context_expr, ast.Call)
                and ast.unparse(item.context_expr.func) in ("socket.socket", "socket")
            }
            calls = _socket_calls(node.body, sockets)
            if "bind" in calls and "listen" not in calls and "connect" not in calls:
                lines.append(node.lineno)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            local = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            calls = _socket_calls(node.body, local)
            zero = [c for c in calls.get("bind", []) if _binds_port_zero(c)]
            if zero and "listen" not in calls and "connect" not in calls:
                lines += [c.lineno for c in zero]
    return sorted(set(lines))


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
    assert offenders == {}, "probe ports with common.ports (free_port, port_free) instead"
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
        "def bare():\n"
        "    s = socket.socket()\n"
        "    s.bind(('', 0))\n"
        "    port = s.getsockname()[1]\n"
        "    s.close()\n"
        "    return port\n"
        "class Server:\n"
        "    def __init__(self):\n"
        "        self.sock = socket.socket()\n"
        "        self.sock.bind(('127.0.0.1', 0))\n"
    )
    assert imports_of_tests(sample) == ["tests.ports", "tests.e2e"]
    assert port_probes(sample) == [5, 6, 9, 17]
