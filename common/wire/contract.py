"""Validate supervisor bodies against the route schemas shipped with this package.

Both sides read every body through here: the supervisor its requests (`supervisor/api.py`), the
control plane its answers (`fleets/reconciler/supervisor/reports.py`). One integer rule holds on
the whole wire: a number with no fractional part is an integer (`4.0` passes where the schema says
`integer`, as JSON Schema and the original system have it) and is read as one (`as_declared`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import httpx

from common.documents import WireValidator, schema_validator
from common.documents import problems as document_problems


@dataclass(frozen=True)
class WireRoute:
    """One route: its request schema (None: no body) and its response schema per status."""

    method: str
    path: str  # `{name}` stands for one path segment
    request: str | None
    responses: dict[int, str]
    _pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = re.split(r"\{[a-z]+\}", self.path)
        pattern = "[^/]+".join(re.escape(p) for p in parts)
        object.__setattr__(self, "_pattern", re.compile(f"^{pattern}\\Z"))

    def matches(self, method: str, path: str) -> bool:
        return self.method == method and bool(self._pattern.match(path))


ROUTES: tuple[WireRoute, ...] = (
    WireRoute("GET", "/healthz", None, {200: "healthz.response"}),
    WireRoute("GET", "/v1/status", None, {200: "status.response"}),
    WireRoute("GET", "/v1/ready", None, {200: "ready.response"}),
    WireRoute(
        "POST", "/v1/vllm/sleep", "target.request", {200: "action.response", 202: "action.response"}
    ),
    WireRoute("POST", "/v1/vllm/wake", "target.request", {200: "action.response"}),
    WireRoute("POST", "/v1/training/start", "empty.request", {200: "training.response"}),
    WireRoute("POST", "/v1/training/stop", "training-stop.request", {202: "training.response"}),
    WireRoute("GET", "/v1/training/status", None, {200: "training.response"}),
    WireRoute("GET", "/v1/gpu/memory", None, {200: "gpu-memory.response"}),
    WireRoute("POST", "/v1/probe", "probe.request", {200: "probe.response"}),
    # Ours only (feature model.swap): the original has no such route.
    WireRoute("POST", "/v1/models/swap", "swap.request", {202: "swap.response"}),
    # Ours only (feature adapters, docs/adapters.md). `GET /v1/adapters/{id}/files/{path}`
    # answers the file's bytes, not JSON: not listed.
    WireRoute("GET", "/v1/adapters", None, {200: "adapters.response"}),
    WireRoute("PUT", "/v1/adapters/{id}/files/{path}", None, {200: "adapter-file.response"}),
    WireRoute(
        "POST",
        "/v1/adapters/{id}/commit",
        "adapter-commit.request",
        {200: "adapter-commit.response"},
    ),
    WireRoute("POST", "/v1/adapters/load", "adapter-load.request", {200: "adapter-load.response"}),
    WireRoute(
        "POST", "/v1/adapters/unload", "adapter-load.request", {200: "adapter-load.response"}
    ),
    WireRoute("DELETE", "/v1/adapters/{id}", None, {200: "adapter-delete.response"}),
)
ERROR = "error"


def schema_names() -> list[str]:
    """Every schema file shipped, without the `.json` suffix."""
    folder = resources.files(__package__).joinpath("schemas")
    return sorted(
        p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")
    )


@cache
def load(name: str) -> dict[str, Any]:
    text = resources.files(__package__).joinpath("schemas", f"{name}.json").read_text("utf-8")
    return json.loads(text)


def _validator(name: str) -> Any:
    # Schemas are read, their references inlined and checked once (documents caches it).
    return schema_validator(__package__, name, WireValidator)


def problems(name: str, body: Any) -> list[str]:
    """Every way `body` breaks schema `name`, as `path: rule` lines (empty: valid), each naming
    the field at fault in the house's words (`gpuIndex: must be at least 0`)."""
    return [f"{where}: {rule}" for where, rule in document_problems(_validator(name), body)]


def as_declared(name: str, body: Any) -> Any:
    """`body` (valid under schema `name`) with every whole number the schema declares an
    integer read as an int: `{"gpuIndex": 1.0}` is `{"gpuIndex": 1}` to whoever reads it."""
    return _as_declared(_validator(name).schema, body)


def _as_declared(schema: Any, value: Any) -> Any:
    if not isinstance(schema, dict):
        return value
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if isinstance(value, float) and "integer" in kinds and value.is_integer():
        return int(value)
    # Every subschema that may apply is followed: one that does not apply can only turn a whole
    # number that another declares a plain number into an int, which is the same number.
    for key in ("allOf", "anyOf", "oneOf"):
        for sub in schema.get(key, ()):
            value = _as_declared(sub, value)
    for key in ("then", "else"):
        value = _as_declared(schema.get(key), value)
    if isinstance(value, dict):
        fields = schema.get("properties", {})
        rest = schema.get("additionalProperties")
        return {k: _as_declared(fields.get(k, rest), v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_declared(schema.get("items"), v) for v in value]
    return value


def route(method: str, path: str) -> WireRoute:
    return next(r for r in ROUTES if r.matches(method, path))


def response_schema(method: str, path: str, status: int) -> str:
    """The schema a response on this route with this status must match."""
    if not 200 <= status < 300:
        return ERROR
    return route(method, path).responses[status]


class ContractBreach(AssertionError):
    """A body on the wire that its route's schema refuses."""


def response_problems(method: str, path: str, status: int, body: Any) -> list[str]:
    """Every way a response breaks the contract; routes outside it only need the error shape."""
    known = any(r.matches(method, path) for r in ROUTES)
    if not known:
        return [] if 200 <= status < 300 else problems(ERROR, body)
    return problems(response_schema(method, path, status), body)


def check_response(response: httpx.Response) -> None:
    """An httpx response hook: raise ContractBreach when a supervisor answer breaks a schema.

    Tests install it on every client that talks to a supervisor, so whatever the supervisor
    sends in any test is checked against the schemas the control plane validates with.
    """
    response.read()
    request = response.request
    if 200 <= response.status_code < 300 and response.headers.get("content-type", "").startswith(
        "application/octet-stream"
    ):
        return  # a file's bytes (an adapter's, docs/adapters.md): no JSON to check
    try:
        body = response.json()
    except ValueError as exc:
        raise ContractBreach(f"{request.method} {request.url.path}: body is not JSON") from exc
    found = response_problems(request.method, request.url.path, response.status_code, body)
    if found:
        raise ContractBreach(
            f"{request.method} {request.url.path} -> {response.status_code}: " + "; ".join(found)
        )
