"""The server's side of the supervisor wire contract (docs/design.md, "Supervisor contract").

Every call returns a `Call`: a validated value, or a `CallError` whose `kind` says what went
wrong (unauthorized, network, timeout, http, bad_body). Nothing here raises on a bad answer, so a
supervisor that returns garbage can never abort a tick. The token goes in the Authorization
header only: never into a message, an event or a log line.

The HTTP transport is injectable (`use_transport`) so unit tests can script a supervisor.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx
from django.conf import settings

from fleets.reconciler import metrics
from haru.env import redact_url

# httpx logs every request at INFO: one line per heartbeat per domain per second would bury
# everything else. Quiet it unless the logging config chose a level for it.
if logging.getLogger("httpx").level == logging.NOTSET:
    logging.getLogger("httpx").setLevel(logging.WARNING)

# A single supervisor call never blocks a tick longer than this, whatever the step's budget.
CALL_CAP_S = 10.0
# Even a step past its budget gets one short final look, so a reply that lands right at the
# deadline still counts.
MIN_CALL_S = 0.25

UNAUTHORIZED = "unauthorized"
NETWORK = "network"
TIMEOUT = "timeout"
HTTP = "http"
BAD_BODY = "bad_body"

T = TypeVar("T")


@dataclass(frozen=True)
class CallError:
    """Why a call produced no value; `code` is the supervisor's own error code, if it sent one."""

    kind: str
    message: str
    status: int | None = None
    code: str | None = None


@dataclass(frozen=True)
class Call(Generic[T]):
    value: T | None = None
    error: CallError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def unauthorized(self) -> bool:
        return self.error is not None and self.error.kind == UNAUTHORIZED


class BadBody(ValueError):
    """A response body that does not match the contract."""


# -- validated bodies -------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelReport:
    name: str
    sleeping: bool | None  # None: the supervisor could not tell
    error: str | None = None


@dataclass(frozen=True)
class TrainingReport:
    state: str  # idle | running | stopping (anything else reads as unknown)
    pids: tuple[int, ...] = ()

    @property
    def running_with_pid(self) -> bool:
        # A trainer that says "running" but has no PID has not proven it runs.
        return self.state == "running" and bool(self.pids)


@dataclass(frozen=True)
class SlotReport:
    gpu_index: int
    kind: str
    models: tuple[ModelReport, ...] = ()
    training: TrainingReport | None = None


@dataclass(frozen=True)
class StatusReport:
    slots: tuple[SlotReport, ...]
    ready: bool
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def model(self, name: str) -> ModelReport | None:
        for slot in self.slots:
            for m in slot.models:
                if m.name == name:
                    return m
        return None

    def training(self, gpu_index: int) -> TrainingReport | None:
        for slot in self.slots:
            if slot.kind == "training" and slot.gpu_index == gpu_index:
                return slot.training
        return None


@dataclass(frozen=True)
class GpuReport:
    index: int
    used_mib: float
    total_mib: float

    @property
    def used_ratio(self) -> float:
        return self.used_mib / self.total_mib if self.total_mib > 0 else 1.0


@dataclass(frozen=True)
class GpuMemory:
    gpus: tuple[GpuReport, ...]
    # The validated body as sent (names, processes, MIG instances): what the dashboard draws.
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def gpu(self, index: int) -> GpuReport | None:
        return next((g for g in self.gpus if g.index == index), None)


@dataclass(frozen=True)
class ProbeResult:
    model: str
    ok: bool
    latency_ms: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class ProbeReport:
    ok: bool
    results: tuple[ProbeResult, ...]

    def result(self, model: str) -> ProbeResult | None:
        return next((r for r in self.results if r.model == model), None)


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadBody(f"{where}: expected an object")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise BadBody(f"{where}: expected a list")
    return value


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadBody(f"{where}: expected an integer")
    return value


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadBody(f"{where}: expected a number")
    return float(value)


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise BadBody(f"{where}: expected a string")
    return value


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def parse_status(body: Any) -> StatusReport:
    """Validate a `GET /v1/status` body."""
    root = _obj(body, "status")
    slots = []
    for i, raw in enumerate(_list(root.get("slots"), "status.slots")):
        where = f"status.slots[{i}]"
        item = _obj(raw, where)
        kind = _str(item.get("kind"), f"{where}.kind")
        gpu = _int(item.get("gpuIndex"), f"{where}.gpuIndex")
        models: list[ModelReport] = []
        training = None
        if kind == "inference":
            for j, m in enumerate(_list(item.get("models") or [], f"{where}.models")):
                mo = _obj(m, f"{where}.models[{j}]")
                sleeping = mo.get("sleeping")
                if sleeping is not None and not isinstance(sleeping, bool):
                    # The original contract: a non-boolean reading is "unknown", not an error.
                    sleeping = None
                models.append(
                    ModelReport(
                        name=_str(mo.get("name"), f"{where}.models[{j}].name"),
                        sleeping=sleeping,
                        error=_opt_str(mo.get("error")),
                    )
                )
        elif kind == "training":
            tr = _obj(item.get("training"), f"{where}.training")
            pids = tuple(
                _int(p, f"{where}.training.pids[]")
                for p in _list(tr.get("pids") or [], f"{where}.training.pids")
            )
            training = TrainingReport(
                state=_str(tr.get("state"), f"{where}.training.state"), pids=pids
            )
        else:
            raise BadBody(f"{where}.kind: unknown kind {kind!r}")
        slots.append(SlotReport(gpu_index=gpu, kind=kind, models=tuple(models), training=training))
    ready = root.get("ready")
    return StatusReport(slots=tuple(slots), ready=ready is True, raw=root)


def _processes(value: Any, where: str) -> None:
    """Check a GPU's (or MIG instance's) process list: `[{pid, usedMiB|null, ...}]` or absent."""
    for j, raw in enumerate(_list(value if value is not None else [], where)):
        p = _obj(raw, f"{where}[{j}]")
        _int(p.get("pid"), f"{where}[{j}].pid")
        if p.get("usedMiB") is not None:
            _number(p.get("usedMiB"), f"{where}[{j}].usedMiB")


def parse_gpu_memory(body: Any) -> GpuMemory:
    """Validate a `GET /v1/gpu/memory` body (`supervisor/gpu/facts.py` writes it)."""
    root = _obj(body, "gpu memory")
    gpus = []
    for i, raw in enumerate(_list(root.get("gpus"), "gpus")):
        g = _obj(raw, f"gpus[{i}]")
        total = _number(g.get("totalMiB"), f"gpus[{i}].totalMiB")
        used = _number(g.get("usedMiB"), f"gpus[{i}].usedMiB")
        if total <= 0 or used < 0:
            raise BadBody(f"gpus[{i}]: usedMiB/totalMiB out of range")
        _processes(g.get("processes"), f"gpus[{i}].processes")
        if g.get("mig") is not None:
            mig = _obj(g.get("mig"), f"gpus[{i}].mig")
            for k, inst in enumerate(_list(mig.get("instances") or [], f"gpus[{i}].mig.instances")):
                where = f"gpus[{i}].mig.instances[{k}]"
                _processes(_obj(inst, where).get("processes"), f"{where}.processes")
        gpus.append(
            GpuReport(
                index=_int(g.get("index"), f"gpus[{i}].index"), used_mib=used, total_mib=total
            )
        )
    return GpuMemory(gpus=tuple(gpus), raw=root)


def parse_probe(body: Any) -> ProbeReport:
    """Validate a `POST /v1/probe` body."""
    root = _obj(body, "probe")
    results = []
    for i, raw in enumerate(_list(root.get("results"), "probe.results")):
        r = _obj(raw, f"probe.results[{i}]")
        ok = r.get("ok")
        if not isinstance(ok, bool):
            raise BadBody(f"probe.results[{i}].ok: expected a boolean")
        latency = r.get("latencyMs")
        results.append(
            ProbeResult(
                model=_str(r.get("model"), f"probe.results[{i}].model"),
                ok=ok,
                latency_ms=latency
                if isinstance(latency, int) and not isinstance(latency, bool)
                else None,
                error=_opt_str(r.get("error")),
            )
        )
    ok = root.get("ok")
    if not isinstance(ok, bool):
        raise BadBody("probe.ok: expected a boolean")
    return ProbeReport(ok=ok, results=tuple(results))


def parse_ack(body: Any) -> dict[str, Any]:
    """Accept any JSON object (the POST routes answer with a summary we only log)."""
    return _obj(body, "response")


# -- transport --------------------------------------------------------------------------------

_lock = threading.Lock()
_transport: httpx.BaseTransport | None = None
_http: httpx.Client | None = None


def _shared_http() -> httpx.Client:
    """Return the process-wide HTTP client: pooled keep-alive connections to every supervisor."""
    global _http
    with _lock:
        if _http is None:
            # trust_env=False: an HTTP(S)_PROXY meant for the internet must never capture calls
            # to supervisors on private addresses.
            _http = httpx.Client(
                transport=_transport,
                trust_env=False,
                follow_redirects=False,
                headers={"User-Agent": "haru-reconciler"},
            )
        return _http


def use_transport(transport: httpx.BaseTransport | None) -> httpx.BaseTransport | None:
    """Route every supervisor call through `transport` (tests); return the previous one."""
    global _transport, _http
    with _lock:
        previous, _transport = _transport, transport
        old, _http = _http, None
    if old is not None:
        old.close()
    return previous


ErrorHook = Callable[[str, CallError], None]


def gpu_facts_unavailable(error: CallError | None) -> bool:
    """Whether a `/v1/gpu/memory` error is the supervisor saying it has no GPU facts (501: no
    NVML on that host), which is an answer, not a failure."""
    return error is not None and error.kind == HTTP and error.status == 501


def _count_error(call: str, error: CallError) -> None:
    if call == "gpu_memory" and gpu_facts_unavailable(error):
        return  # a host without NVML says so on every heartbeat, by design

    metrics.SUPERVISOR_CALL_ERRORS.labels(call=call, kind=error.kind).inc()


class SupervisorClient:
    """Talk to one domain's supervisor."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None,
        http: httpx.Client | None = None,
        on_error: ErrorHook | None = _count_error,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._where = redact_url(self.base_url)
        self._token = token
        self._http = http
        self._on_error = on_error

    def status(self, *, timeout: float) -> Call[StatusReport]:
        return self._call("status", "GET", "/v1/status", timeout, parse_status)

    def gpu_memory(self, *, timeout: float) -> Call[GpuMemory]:
        return self._call("gpu_memory", "GET", "/v1/gpu/memory", timeout, parse_gpu_memory)

    def wake(self, *, timeout: float, gpu_index: int | None = None) -> Call[dict[str, Any]]:
        body = {"gpuIndex": gpu_index} if gpu_index is not None else {}
        return self._call("wake", "POST", "/v1/vllm/wake", timeout, parse_ack, body)

    def sleep(self, *, timeout: float, gpu_index: int | None = None) -> Call[dict[str, Any]]:
        body = {"gpuIndex": gpu_index} if gpu_index is not None else {}
        return self._call("sleep", "POST", "/v1/vllm/sleep", timeout, parse_ack, body)

    def training_start(self, *, timeout: float) -> Call[dict[str, Any]]:
        return self._call("training_start", "POST", "/v1/training/start", timeout, parse_ack)

    def training_stop(self, *, grace_ms: int, timeout: float) -> Call[dict[str, Any]]:
        return self._call(
            "training_stop",
            "POST",
            "/v1/training/stop",
            timeout,
            parse_ack,
            {"graceMs": grace_ms},
        )

    def probe(
        self,
        *,
        prompt: str,
        max_tokens: int,
        timeout_ms: int,
        models: Sequence[str] | None,
        timeout: float,
    ) -> Call[ProbeReport]:
        body: dict[str, Any] = {"prompt": prompt, "maxTokens": max_tokens, "timeoutMs": timeout_ms}
        if models is not None:
            body["models"] = list(models)
        return self._call("probe", "POST", "/v1/probe", timeout, parse_probe, body)

    def _call(
        self,
        name: str,
        method: str,
        path: str,
        timeout: float,
        parse: Callable[[Any], T],
        body: dict[str, Any] | None = None,
    ) -> Call[T]:
        result = self._send(method, path, timeout, parse, body)
        if result.error is not None and self._on_error is not None:
            self._on_error(name, result.error)
        return result

    def _send(
        self,
        method: str,
        path: str,
        timeout: float,
        parse: Callable[[Any], Any],
        body: Any,
    ) -> Call[Any]:
        http = self._http or _shared_http()
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        url = self.base_url + path
        try:
            response = http.request(
                method,
                url,
                json=body if method == "POST" else None,
                headers=headers,
                timeout=max(MIN_CALL_S, timeout),
            )
        except httpx.TimeoutException:
            return Call(
                error=CallError(
                    TIMEOUT, f"{method} {self._where}{path} timed out after {timeout:.1f}s"
                )
            )
        except httpx.HTTPError as exc:
            # The exception text names the URL and the OS error, never our headers.
            return Call(
                error=CallError(
                    NETWORK, f"{method} {self._where}{path}: {type(exc).__name__}: {exc}"
                )
            )
        except Exception as exc:  # noqa: BLE001 - a broken transport must not abort a tick
            return Call(
                error=CallError(NETWORK, f"{method} {self._where}{path}: {type(exc).__name__}")
            )
        status = response.status_code
        if status in (401, 403):
            return Call(
                error=CallError(
                    UNAUTHORIZED,
                    f"{method} {self._where}{path}: supervisor refused our token (HTTP {status})",
                    status=status,
                )
            )
        try:
            payload = response.json()
        except ValueError:
            payload = None
        if not 200 <= status < 300:
            code, message = _envelope(payload)
            detail = f"{code}: {message}" if code else f"HTTP {status}"
            return Call(
                error=CallError(
                    HTTP,
                    f"{method} {self._where}{path}: HTTP {status} {detail}"[:500],
                    status,
                    code,
                )
            )
        if payload is None:
            return Call(
                error=CallError(BAD_BODY, f"{method} {self._where}{path}: body is not JSON", status)
            )
        try:
            return Call(value=parse(payload))
        except BadBody as exc:
            return Call(
                error=CallError(BAD_BODY, f"{method} {self._where}{path}: {exc}"[:500], status)
            )


def _envelope(payload: Any) -> tuple[str | None, str]:
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        err = payload["error"]
        code = err.get("code") if isinstance(err.get("code"), str) else None
        message = err.get("message") if isinstance(err.get("message"), str) else ""
        return code, message[:300]
    return None, ""


def client_for(supervisor_url: str) -> SupervisorClient:
    """Return a client for one supervisor, with the configured token."""

    return SupervisorClient(supervisor_url, token=settings.HARU["supervisor_token"])
