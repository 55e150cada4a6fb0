"""Every error code is declared once, and the lists in the docs are the ones the code declares.

An operation's `error.code` comes from `fleets.core.states.OperationErrorCode`; the design
document lists the failure codes under "Error codes" and the cancel reasons after it. Every
error envelope the control plane answers (REST API, dashboard JSON, chat proxy) carries a
`fleets.base.errors.ErrorCode`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from rest_framework import exceptions

from fleets.api import errors as api_errors
from fleets.api.auth import ChatTokenRefused
from fleets.base.errors import ErrorCode, ServiceError
from fleets.core.states import CANCEL_REASONS, OperationErrorCode
from fleets.proxy import errors as proxy_errors
from fleets.services import provisioning  # noqa: F401 - defines ProvisionRefused

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


def _subclasses(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


def test_every_service_error_and_api_exception_answers_a_declared_code():
    assert {c.code for c in _subclasses(ServiceError)} <= set(ErrorCode)
    assert set(api_errors._CODES.values()) <= set(ErrorCode)
    own = [api_errors.PayloadTooLarge, ChatTokenRefused]
    assert all(c.default_code in set(ErrorCode) for c in own)
    assert issubclass(ChatTokenRefused, exceptions.PermissionDenied)


def test_every_proxy_error_answers_a_declared_code():
    made = [
        proxy_errors.unauthorized(),
        proxy_errors.payload_too_large(1),
        proxy_errors.hold_capacity(1),
        proxy_errors.method_not_allowed("POST"),
        *(
            factory("why")
            for factory in (
                proxy_errors.invalid_request,
                proxy_errors.fleet_not_found,
                proxy_errors.model_not_found,
                proxy_errors.model_unavailable,
                proxy_errors.no_active_domain,
                proxy_errors.state_store_unavailable,
                proxy_errors.upstream_timeout,
                proxy_errors.upstream_unreachable,
                proxy_errors.hold_expired,
                proxy_errors.draining,
            )
        ),
    ]
    assert {e.code for e in made} <= set(ErrorCode)


def _envelope_literals(tree: ast.AST) -> list[int]:
    """Lines where an error envelope is given its code as a string literal."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = [k.value if isinstance(k, ast.Constant) else None for k in node.keys]
            if "error" in keys and isinstance(node.values[keys.index("error")], ast.Dict):
                inner = node.values[keys.index("error")]
                assert isinstance(inner, ast.Dict)
                found += [
                    node.lineno
                    for key, value in zip(inner.keys, inner.values, strict=True)
                    if isinstance(key, ast.Constant)
                    and key.value == "code"
                    and isinstance(value, ast.Constant)
                ]
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            at = {"envelope": 0, "ProxyError": 1, "ActionResult": 2}.get(name)
            if name == "ActionResult" and not (
                node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value is False
            ):
                continue  # a success's code ("reconciled") is not an error's
            if at is not None and len(node.args) > at and isinstance(node.args[at], ast.Constant):
                found.append(node.lineno)
    return found


def test_no_error_envelope_spells_its_code():
    spelled = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "fleets").rglob("*.py"))
        for line in _envelope_literals(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert spelled == []


def test_the_finder_sees_an_envelope_that_spells_its_code():
    spelled = """
JsonResponse({"error": {"code": "nope", "message": "x"}})
envelope("nope", "x", 400)
ProxyError(503, "nope", "x")
ActionResult(False, 500, "nope", "x")
ActionResult(True, 200, "reconciled", "x")
"""
    assert sorted(_envelope_literals(ast.parse(spelled))) == [2, 3, 4, 5]
