"""Validate supervisor bodies against the route schemas shipped with this package."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import httpx
from jsonschema import Draft202012Validator


@dataclass(frozen=True)
class WireRoute:
    """One route: its request schema (None: no body) and its response schema per status."""

    method: str
    path: str
    request: str | None
    responses: dict[int, str]


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


@cache
def _validator(name: str) -> Draft202012Validator:
    schema = load(name)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def problems(name: str, body: Any) -> list[str]:
    """Every way `body` breaks schema `name`, as `path: message` lines (empty: valid)."""
    found = []
    for err in sorted(_validator(name).iter_errors(body), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in err.absolute_path) or "(body)"
        found.append(f"{where}: {err.message}")
    return found


def route(method: str, path: str) -> WireRoute:
    return next(r for r in ROUTES if r.method == method and r.path == path)


def response_schema(method: str, path: str, status: int) -> str:
    """The schema a response on this route with this status must match."""
    if not 200 <= status < 300:
        return ERROR
    return route(method, path).responses[status]


class ContractBreach(AssertionError):
    """A body on the wire that its route's schema refuses."""


def response_problems(method: str, path: str, status: int, body: Any) -> list[str]:
    """Every way a response breaks the contract; routes outside it only need the error shape."""
    known = any(r.method == method and r.path == path for r in ROUTES)
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
    try:
        body = response.json()
    except ValueError as exc:
        raise ContractBreach(f"{request.method} {request.url.path}: body is not JSON") from exc
    found = response_problems(request.method, request.url.path, response.status_code, body)
    if found:
        raise ContractBreach(
            f"{request.method} {request.url.path} -> {response.status_code}: " + "; ".join(found)
        )
