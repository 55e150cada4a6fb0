"""The error codes docs/design.md lists are the ones the code declares.

An operation's `error.code` comes from `fleets.core.states.OperationErrorCode`; the design
document lists the failure codes under "Error codes" and the cancel reasons after it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from fleets.core.states import CANCEL_REASONS, OperationErrorCode

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"


def _paragraph_after(text: str, start: str) -> str:
    """The text from the line that begins with `start` to the next blank line."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(start))
    out = []
    for line in lines[first:]:
        if not line.strip() and out:
            break
        out.append(line)
    return "\n".join(out)


def _codes(paragraph: str) -> list[str]:
    return re.findall(r"`([a-z_]+)`", paragraph)


def test_the_design_lists_every_failure_code_an_operation_can_end_with():
    text = DESIGN.read_text(encoding="utf-8")
    listed = _codes(_paragraph_after(text.split("### Error codes", 1)[1].lstrip("\n"), "`"))
    assert len(listed) == len(set(listed)), listed
    assert set(listed) == {code.value for code in OperationErrorCode} - CANCEL_REASONS


def test_the_design_names_every_cancel_reason():
    paragraph = _paragraph_after(DESIGN.read_text(encoding="utf-8"), "Cancel reasons")
    named = set(_codes(paragraph))
    assert named >= CANCEL_REASONS, sorted(CANCEL_REASONS - named)


def test_an_operation_fails_only_with_a_declared_code():
    # A step's `failed(<code>, message)` or `operation_fail(code=...)` given a string literal
    # would be a code the lists above do not know.
    literals = []
    for path in sorted((ROOT / "fleets").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                continue
            codes = [k.value for k in node.keywords if k.arg == "code"]
            if node.func.id == "failed" and node.args:
                codes.append(node.args[0])
            elif node.func.id != "operation_fail":
                continue
            literals += [
                f"{path.relative_to(ROOT)}:{node.lineno}"
                for code in codes
                if isinstance(code, ast.Constant)
            ]
    assert literals == []
