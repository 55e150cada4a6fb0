"""The supervisor's HTTP API: thin routes over `Host`, every error in one envelope."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from common.limits import MAX_MS
from common.wire import bounded_json, contract
from common.wire.shape import compact
from supervisor.adapters import AdapterRefused, check_file_name, check_id
from supervisor.auth import BearerAuth
from supervisor.errors import ApiError, error_body
from supervisor.gpu.facts import GpuQueryFailed, GpuUnavailable
from supervisor.host import Host, InsufficientGpuMemory, InvalidTarget, ModelFailures, ShuttingDown
from supervisor.swaps import SwapRefused
from supervisor.training import SpawnFailed, TrainingBusy

log = logging.getLogger(__name__)

# Control requests are a few fields; anything bigger is a mistake or an attack.
MAX_BODY_BYTES = 64 * 1024


async def _read_capped(request: Request) -> bytes:
    """Read the body, refusing one past MAX_BODY_BYTES before it is all read: a declared
    Content-Length at once, a chunked body as soon as the bytes received pass the cap."""
    too_big = ApiError(413, "payload_too_large", f"request body exceeds {MAX_BODY_BYTES} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_big
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


async def read_body(request: Request) -> dict[str, Any]:
    """Parse the body (empty reads as `{}`) and check it against the route's request schema in
    the wire contract (`common/wire/schemas/`): every problem in one 400 naming its field. The
    fields come back as the schema declares them (a whole number where it says integer is an
    int). A key repeated in the body is refused (the original keeps the last one; docs/wire.md).
    """
    body = await _read_capped(request)
    data: Any = {}
    if body.strip():
        try:
            data = bounded_json.loads(body)
        except ValueError as exc:
            raise ApiError(400, "invalid_request", f"body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_request", "body must be a JSON object")
    schema = contract.route(request.method, request.url.path).request
    assert schema is not None, f"{request.url.path} takes no body"
    found = contract.problems(schema, data)
    if found:
        raise ApiError(400, "invalid_request", "; ".join(found))
    body_read: dict[str, Any] = contract.as_declared(schema, data)
    return body_read


def host_of(request: Request) -> Host:
    return request.app.state.host


async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


class WireResponse(JSONResponse):
    """A JSON answer in UTF-8, or in escaped ASCII when it holds a lone surrogate (an engine's
    answer echoed by a golden probe may): that has no UTF-8 form, and the answer must still go."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


def wire(body: Any, status_code: int = 200) -> JSONResponse:
    """Render a body the wire contract's way: optional fields left out, never null."""
    return WireResponse(compact(body), status_code=status_code)


def model_selection(request: Request) -> list[str] | None:
    """The original's model selector: repeated `?model=`; a lone empty value selects none."""
    values = request.query_params.getlist("model")
    if not values:
        return None
    return [] if values == [""] else values


async def status(request: Request) -> JSONResponse:
    return wire(await host_of(request).status(model_selection(request)))


async def ready(request: Request) -> JSONResponse:
    # Always 200, as in the original: the answer is the body, not the status code.
    is_ready, known, reasons = await host_of(request).readiness()
    return wire({"ready": is_ready, "stateKnown": known, "reasons": reasons})


async def _gpu_target(request: Request) -> int | None:
    gpu_index: int | None = (await read_body(request)).get("gpuIndex")
    return gpu_index


def _query_seconds(request: Request, name: str, least: int = 1) -> float | None:
    """A query parameter of milliseconds (`least` to MAX_MS) in seconds; None when absent."""
    raw = request.query_params.get(name)
    if raw is None:
        return None
    if not raw.isdigit() or not least <= int(raw) <= MAX_MS:
        kind = "a positive integer" if least > 0 else "a non-negative integer"
        raise ApiError(400, "invalid_request", f"{name} must be {kind}")
    return int(raw) / 1000


async def vllm_sleep(request: Request) -> JSONResponse:
    gpu_index = await _gpu_target(request)
    # Ours (the original ignores the query, and its callers get the original's answer: held
    # until every server sleeps, the drain bounded by drainBudgetMs alone). `?waitMs=` bounds
    # how long this call is held; `?budgetMs=` how long the caller waits for the sleep all
    # told, which ends the drain early enough for the sleep to finish within it.
    # `?drainMs=` (feature drain-bound) bounds the drain itself: past it the sleep aborts what
    # still runs, for a caller that moves those requests elsewhere (a planned promotion); 0
    # aborts at once, what a caller that moves every stream at the switch asks.
    wait_s = _query_seconds(request, "waitMs")
    budget_s = _query_seconds(request, "budgetMs")
    drain_s = _query_seconds(request, "drainMs", least=0)
    result = await host_of(request).sleep(gpu_index, wait_s, budget_s, drain_s)
    return wire(result, 202 if result["status"] == "draining" else 200)


async def vllm_wake(request: Request) -> JSONResponse:
    gpu_index = await _gpu_target(request)
    return wire(await host_of(request).wake(gpu_index))


async def training_start(request: Request) -> JSONResponse:
    await read_body(request)
    slots = await host_of(request).training_start()
    return wire({"status": "ok", "slots": slots})


async def training_stop(request: Request) -> JSONResponse:
    grace_ms = (await read_body(request)).get("graceMs")
    return wire({"status": "ok", "slots": await host_of(request).training_stop(grace_ms)}, 202)


async def training_status(request: Request) -> JSONResponse:
    return wire({"slots": host_of(request).training_status()})


async def gpu_memory(request: Request) -> JSONResponse:
    return wire(await host_of(request).gpu_memory())


async def probe(request: Request) -> JSONResponse:
    body = await read_body(request)
    models = body.get("models")
    if models is None:
        models = model_selection(request)
    result = await host_of(request).probe(
        prompt=body.get("prompt", "ping"),
        max_tokens=body.get("maxTokens", 4),
        timeout_ms=body.get("timeoutMs", 60_000),
        models=models,
        seed=body.get("seed"),
        adapters=body.get("adapters"),
    )
    return wire(result)


async def model_swap(request: Request) -> JSONResponse:
    # Ours only (feature model.swap): answered once the swap is checked and started; its
    # progress is the model's `swap` in the status report (supervisor/swaps.py).
    body = await read_body(request)
    timeout_ms = body.get("startTimeoutMs")
    result = await host_of(request).begin_swap(
        model=body["model"],
        profile=body["profile"],
        mode=body["mode"],
        api_key=body.get("apiKey"),
        start_timeout_s=timeout_ms / 1000 if timeout_ms is not None else None,
    )
    return wire(result, 202)


# -- LoRA adapters (docs/adapters.md, "The supervisor's adapter API") -------------------------

# How much of a chunk is gathered before one write (off the event loop), and read per file read.
WRITE_BLOCK_BYTES = 1024 * 1024
READ_BLOCK_BYTES = 1024 * 1024


async def adapters_list(request: Request) -> JSONResponse:
    return wire(await host_of(request).adapters())


def _range_start(header: str | None, size: int) -> int | None:
    """`bytes=N-` -> N; None without the header; ApiError 416 for any other form, or N past
    the end (N equal to the size of an empty file is fine: nothing is left)."""
    if header is None:
        return None
    unit, _, spec = header.strip().partition("=")
    first, dash, last = spec.partition("-")
    if unit != "bytes" or not dash or last or not first.isdigit() or int(first) > size:
        raise ApiError(
            416,
            "range_not_satisfiable",
            f"only Range: bytes=N- with N at most {size} is served",
            details={"bytes": size},
        )
    return int(first)


async def adapter_file_get(request: Request) -> StreamingResponse:
    """A stored adapter's file, streamed; `Range: bytes=N-` answers 206 from byte N (a copy
    that was cut off continues where it stopped)."""
    path = host_of(request).adapter_file(request.path_params["id"], request.path_params["path"])
    size = (await asyncio.to_thread(path.stat)).st_size
    start = _range_start(request.headers.get("range"), size)

    async def chunks() -> AsyncIterator[bytes]:
        f = await asyncio.to_thread(open, path, "rb")
        try:
            await asyncio.to_thread(f.seek, start or 0)
            while block := await asyncio.to_thread(f.read, READ_BLOCK_BYTES):
                yield block
        finally:
            await asyncio.to_thread(f.close)

    headers = {"content-length": str(size - (start or 0)), "accept-ranges": "bytes"}
    if start is not None:
        headers["content-range"] = f"bytes {start}-{max(size - 1, start)}/{size}"
    return StreamingResponse(
        chunks(),
        status_code=206 if start is not None else 200,
        media_type="application/octet-stream",
        headers=headers,
    )


async def adapter_file_put(request: Request) -> JSONResponse:
    """Append the body at `?offset=N` of the incoming copy's file, streamed to disk in blocks
    (never the whole chunk in memory). The edge has already capped the body at
    HARU_SUPERVISOR_ADAPTER_CHUNK_BYTES; this checks it again (a direct ASGI caller), and the
    adapter's total before each block is written."""
    host = host_of(request)
    adapter_id = check_id(request.path_params["id"])
    name = check_file_name(request.path_params["path"])
    raw = request.query_params.get("offset", "")
    if not raw.isdigit() or len(raw) > 15:
        raise ApiError(400, "invalid_request", "offset: must be a non-negative integer")
    offset = int(raw)
    cap = host.deps.adapters.chunk_bytes
    too_big = ApiError(
        413,
        "payload_too_large",
        f"a chunk exceeds HARU_SUPERVISOR_ADAPTER_CHUNK_BYTES ({cap} bytes)",
    )
    declared_raw = request.headers.get("content-length", "")
    declared = int(declared_raw) if declared_raw.isdigit() else None
    if declared is not None and declared > cap:
        raise too_big
    store = host.adapter_store_required()
    async with host.adapter_transfer(adapter_id, name):
        target = await asyncio.to_thread(store.begin_chunk, adapter_id, name, offset, declared)
        f = await asyncio.to_thread(open, target, "ab")
        try:
            received = 0
            block: list[bytes] = []
            held = 0
            async for piece in request.stream():
                received += len(piece)
                if received > cap:
                    raise too_big
                block.append(piece)
                held += len(piece)
                if held >= WRITE_BLOCK_BYTES:
                    await _write_block(store, f, adapter_id, name, block)
                    block, held = [], 0
            if block:
                await _write_block(store, f, adapter_id, name, block)
        finally:
            await asyncio.to_thread(f.close)
        size = store.incoming_size(adapter_id, name)
    return wire({"id": adapter_id, "path": name, "bytes": size})


async def _write_block(store: Any, f: Any, adapter_id: str, name: str, block: list[bytes]) -> None:
    data = b"".join(block)
    await asyncio.to_thread(f.flush)
    await asyncio.to_thread(store.check_room, adapter_id, name, len(data))
    await asyncio.to_thread(f.write, data)


async def adapter_commit(request: Request) -> JSONResponse:
    body = await read_body(request)
    return wire(await host_of(request).adapter_commit(request.path_params["id"], body["digest"]))


async def adapter_load(request: Request) -> JSONResponse:
    body = await read_body(request)
    if "id" not in body:
        raise ApiError(400, "invalid_request", "id: is required to load an adapter")
    return wire(await host_of(request).adapter_load(body["model"], body["name"], body["id"]))


async def adapter_unload(request: Request) -> JSONResponse:
    body = await read_body(request)
    return wire(await host_of(request).adapter_unload(body["model"], body["name"]))


async def adapter_delete(request: Request) -> JSONResponse:
    adapter_id = request.path_params["id"]
    await host_of(request).adapter_delete(adapter_id)
    return wire({"id": adapter_id, "deleted": True})


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.body(), status_code=exc.status)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    code = codes.get(exc.status_code, "http_error")
    message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed here"}
    return JSONResponse(
        error_body(code, message.get(exc.status_code, str(exc.detail))),
        status_code=exc.status_code,
        headers=exc.headers,
    )


async def _domain_error(request: Request, exc: Exception) -> JSONResponse:
    """Map the host's exceptions to statuses and codes."""
    if isinstance(exc, InvalidTarget):
        err = ApiError(404, "invalid_target", str(exc))
    elif isinstance(exc, InsufficientGpuMemory):
        # 409: the host is in a state that conflicts with the request; waiting will not fix a
        # leak, so the caller should fail rather than retry.
        err = ApiError(409, "insufficient_gpu_memory", str(exc), details={"gpus": exc.shortfalls})
    elif isinstance(exc, ModelFailures):
        err = ApiError(502, f"{exc.action}_failed", str(exc), details={"failures": exc.failures})
    elif isinstance(exc, ShuttingDown):
        err = ApiError(503, "shutting_down", str(exc))
    elif isinstance(exc, SwapRefused):
        err = ApiError(exc.status, exc.code, str(exc))
    elif isinstance(exc, AdapterRefused):
        err = ApiError(exc.status, exc.code, str(exc), details=exc.details)
    elif isinstance(exc, TrainingBusy):
        err = ApiError(409, "training_stopping", str(exc))
    elif isinstance(exc, SpawnFailed):
        err = ApiError(500, "spawn_failed", str(exc))
    elif isinstance(exc, GpuUnavailable):
        err = ApiError(501, "gpu_unavailable", str(exc))
    elif isinstance(exc, GpuQueryFailed):
        err = ApiError(502, "gpu_query_failed", str(exc))
    else:
        log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        err = ApiError(500, "internal_error", "internal error; see the supervisor log")
    return JSONResponse(err.body(), status_code=err.status)


ROUTES = [
    Route("/healthz", healthz, methods=["GET"]),
    Route("/v1/status", status, methods=["GET"]),
    Route("/v1/ready", ready, methods=["GET"]),
    Route("/v1/vllm/sleep", vllm_sleep, methods=["POST"]),
    Route("/v1/vllm/wake", vllm_wake, methods=["POST"]),
    Route("/v1/training/start", training_start, methods=["POST"]),
    Route("/v1/training/stop", training_stop, methods=["POST"]),
    Route("/v1/training/status", training_status, methods=["GET"]),
    Route("/v1/gpu/memory", gpu_memory, methods=["GET"]),
    Route("/v1/probe", probe, methods=["POST"]),
    Route("/v1/models/swap", model_swap, methods=["POST"]),
    Route("/v1/adapters", adapters_list, methods=["GET"]),
    Route("/v1/adapters/load", adapter_load, methods=["POST"]),
    Route("/v1/adapters/unload", adapter_unload, methods=["POST"]),
    Route("/v1/adapters/{id}/files/{path}", adapter_file_get, methods=["GET"]),
    Route("/v1/adapters/{id}/files/{path}", adapter_file_put, methods=["PUT"]),
    Route("/v1/adapters/{id}/commit", adapter_commit, methods=["POST"]),
    Route("/v1/adapters/{id}", adapter_delete, methods=["DELETE"]),
]


def create_app(host: Host, *, token: str | None, manage_host: bool = True) -> Starlette:
    """Build the ASGI app; with `manage_host` its lifespan starts and stops the host."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if manage_host:
            await host.start()
        try:
            yield
        finally:
            if manage_host:
                await host.shutdown()

    handlers: dict[Any, Any] = {
        ApiError: _api_error,
        HTTPException: _http_error,
        InvalidTarget: _domain_error,
        ModelFailures: _domain_error,
        InsufficientGpuMemory: _domain_error,
        ShuttingDown: _domain_error,
        SwapRefused: _domain_error,
        AdapterRefused: _domain_error,
        TrainingBusy: _domain_error,
        SpawnFailed: _domain_error,
        GpuUnavailable: _domain_error,
        GpuQueryFailed: _domain_error,
        Exception: _domain_error,
    }
    app = Starlette(
        routes=ROUTES,
        middleware=[Middleware(BearerAuth, token=token)],
        exception_handlers=handlers,
        lifespan=lifespan,
    )
    app.state.host = host
    return app
