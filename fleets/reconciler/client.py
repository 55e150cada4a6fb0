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
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import urlencode

import httpx

from common.wire import bounded_json, contract
from common.wire.shape import (
    FEATURE_DRAIN,
    FEATURE_PROBE_GOLDEN,
    FEATURE_PROBE_MODELS,
    compact,
)
from fleets.base.conf import haru_settings
from fleets.base.supervisor_tokens import LEGACY_TOKEN_ENV, credentials_for, warn_once
from fleets.core.model_health import Reach
from fleets.core.report import TrainerReportState
from fleets.core.states import SlotKind
from fleets.core.urls import host_allowed, scrub_urls, without_userinfo
from fleets.metrics import reconcile as fleet_metrics
from fleets.reconciler.deadline import DeadlineTransport, deadline

if TYPE_CHECKING:
    from fleets.models import Domain

# httpx logs every request at INFO: one line per heartbeat per domain per second would bury
# everything else. Quiet it unless the logging config chose a level for it.
if logging.getLogger("httpx").level == logging.NOTSET:
    logging.getLogger("httpx").setLevel(logging.WARNING)

# A single supervisor call never blocks a tick longer than this, whatever the step's budget.
CALL_CAP_S = 10.0
# Even a step past its budget gets one short final look, so a reply that lands right at the
# deadline still counts.
MIN_CALL_S = 0.25
# Defaults for the limits `client_for` reads from settings (HARU_SUPERVISOR_MAX_RESPONSE_BYTES,
# HARU_JSON_MAX_DEPTH): a status or GPU report is a few kilobytes and a few levels deep.
MAX_RESPONSE_BYTES = 2 * 1024 * 1024
# A held sleep answers within this share of the call's budget, leaving the rest for the answer.
WAIT_SHARE = 0.8

UNAUTHORIZED = "unauthorized"
NETWORK = "network"
TIMEOUT = "timeout"
HTTP = "http"
BAD_BODY = "bad_body"
# Never sent: the supervisor's host is not in HARU_SUPERVISOR_HOSTS.
REFUSED = "refused"

T = TypeVar("T")


@dataclass(frozen=True)
class CallError:
    """Why a call produced no value; `code` is the supervisor's own error code, if it sent one."""

    kind: str
    message: str
    status: int | None = None
    code: str | None = None
    # The connection itself was refused: nothing listens there (a dead process), as opposed
    # to a timeout (a slow host or a partition). Data-path confirmation decides on it.
    refused: bool = False


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
    draining: bool = False  # a sleep is letting running requests finish first
    # The engine's version (its `GET /version`), ours only; None when not reported.
    engine_version: str | None = None


@dataclass(frozen=True)
class TrainingReport:
    state: str  # a TrainerReportState (anything else reads as unknown)
    pids: tuple[int, ...] = ()

    @property
    def running_with_pid(self) -> bool:
        # A trainer that says "running" but has no PID has not proven it runs.
        return self.state == TrainerReportState.RUNNING and bool(self.pids)


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
    # What the supervisor accepts beyond the original contract (empty on the original).
    features: frozenset[str] = frozenset()
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def model(self, name: str) -> ModelReport | None:
        for slot in self.slots:
            for m in slot.models:
                if m.name == name:
                    return m
        return None

    def training(self, gpu_index: int) -> TrainingReport | None:
        for slot in self.slots:
            if slot.kind == SlotKind.TRAINING and slot.gpu_index == gpu_index:
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
    # Golden probes (feature probe.golden): the LoRA adapter probed (None: the base model),
    # the answer text and the engine's version.
    adapter: str | None = None
    answer: str | None = None
    engine_version: str | None = None


@dataclass(frozen=True)
class ProbeReport:
    ok: bool
    results: tuple[ProbeResult, ...]
    # Whether the answers were asked for greedy and seeded: only then are they comparable.
    golden: bool = False

    def result(self, model: str, adapter: str | None = None) -> ProbeResult | None:
        return next((r for r in self.results if r.model == model and r.adapter == adapter), None)


def _checked(schema: str, body: Any, where: str) -> dict[str, Any]:
    """Validate `body` against the wire contract's schema; raise BadBody naming every problem.

    Strict in what we send, lenient in what we accept: a null where the contract says "leave
    it out" (what this supervisor sent before the contract was written down) reads as absent.
    """
    body = compact(body)
    found = contract.problems(schema, body)
    if found:
        raise BadBody(f"{where}: " + "; ".join(found[:5]))
    return body


# The longest engine version kept: the width of the bindings' and baselines' columns.
ENGINE_VERSION_MAX = 64


def _engine_version(value: str | None) -> str | None:
    """Keep a reported engine version as the columns hold it ("" reads as not reported): a
    longer one (any supervisor may send one) is cut, never a failed database write."""
    return (value or "")[:ENGINE_VERSION_MAX] or None


def parse_status(body: Any) -> StatusReport:
    """Validate a `GET /v1/status` body (ours or the original supervisor's)."""
    root = _checked("status.response", body, "status")
    slots = []
    for item in root["slots"]:
        models = tuple(
            ModelReport(
                name=m["name"],
                sleeping=m["sleeping"],
                error=m.get("error"),
                draining=m.get("draining") is True,
                engine_version=_engine_version(m.get("engineVersion")),
            )
            for m in item.get("models", ())
        )
        training = None
        if item["kind"] == SlotKind.TRAINING:
            tr = item["training"]
            training = TrainingReport(state=tr["state"], pids=tuple(tr["pids"]))
        slots.append(
            SlotReport(
                gpu_index=item["gpuIndex"], kind=item["kind"], models=models, training=training
            )
        )
    return StatusReport(
        slots=tuple(slots),
        ready=root["ready"],
        features=frozenset(root.get("features", ())),
        raw=root,
    )


def parse_gpu_memory(body: Any) -> GpuMemory:
    """Validate a `GET /v1/gpu/memory` body (`supervisor/gpu/facts.py` writes it)."""
    root = _checked("gpu-memory.response", body, "gpu memory")
    gpus = tuple(
        GpuReport(index=g["index"], used_mib=float(g["usedMiB"]), total_mib=float(g["totalMiB"]))
        for g in root["gpus"]
    )
    return GpuMemory(gpus=gpus, raw=root)


def parse_probe(body: Any) -> ProbeReport:
    """Validate a `POST /v1/probe` body."""
    root = _checked("probe.response", body, "probe")
    results = tuple(
        ProbeResult(
            model=r["model"],
            ok=r["ok"],
            latency_ms=int(r["latencyMs"]),
            error=r.get("error"),
            adapter=r.get("adapter"),
            answer=r.get("answer"),
            engine_version=_engine_version(r.get("engineVersion")),
        )
        for r in root["results"]
    )
    return ProbeReport(ok=root["ok"], results=results)


def parse_ack(body: Any) -> dict[str, Any]:
    """Accept any JSON object (the POST routes answer with a summary we only log)."""
    if not isinstance(body, dict):
        raise BadBody("response: expected an object")
    return body


# -- transport --------------------------------------------------------------------------------

_lock = threading.Lock()
_transport: httpx.BaseTransport | None = None
_http: httpx.Client | None = None
# The CA bundle `_http` verifies HTTPS supervisors with (rebuilt when the setting changes).
_http_ca_bundle: str | None = None


def _shared_http() -> httpx.Client:
    """Return the process-wide HTTP client: pooled keep-alive connections to every supervisor."""
    global _http, _http_ca_bundle
    ca_bundle = haru_settings().supervisor_ca_bundle
    with _lock:
        if _http is not None and ca_bundle != _http_ca_bundle:
            _http.close()
            _http = None
        if _http is None:
            _http_ca_bundle = ca_bundle
            # trust_env=False: an HTTP(S)_PROXY meant for the internet must never capture calls
            # to supervisors on private addresses.
            # The default transport bounds every socket operation by the call's overall
            # deadline (a trickling supervisor never resets it); tests inject their own.
            _http = httpx.Client(
                transport=(
                    _transport if _transport is not None else DeadlineTransport(ca_bundle=ca_bundle)
                ),
                trust_env=False,
                follow_redirects=False,
                headers={"User-Agent": "haru-reconciler"},
            )
        return _http


def use_transport(transport: httpx.BaseTransport | None) -> httpx.BaseTransport | None:
    """Route every supervisor call through `transport` (tests); return the previous one."""
    global _transport, _http
    forget_features()  # other peers behind another transport
    forget_tokens()
    with _lock:
        previous, _transport = _transport, transport
        old, _http = _http, None
    if old is not None:
        old.close()
    return previous


ErrorHook = Callable[[str, CallError], None]

# What each supervisor (by base URL) accepts beyond the original contract, learned from its
# `GET /v1/status` (`features`) or from one refused probe. Absent: not learned yet.
_features_lock = threading.Lock()
_features: dict[str, frozenset[str]] = {}
# A selector longer than this goes unsent (the original's client has the same cap): request
# lines that long break proxies, and the caller judges its own models from the results anyway.
MAX_SELECTOR_CHARS = 4096


def learned_features(base_url: str) -> frozenset[str] | None:
    with _features_lock:
        return _features.get(base_url.rstrip("/"))


def learn_features(base_url: str, features: frozenset[str]) -> None:
    with _features_lock:
        _features[base_url.rstrip("/")] = features


def forget_features() -> None:
    """Forget everything learned (tests, and a supervisor replaced by another version)."""
    with _features_lock:
        _features.clear()


# Supervisors (by domain) that, during the migration from the shared token, refused their own
# token and accepted the shared one: sent the shared one first until they accept their own.
_tokens_lock = threading.Lock()
_on_shared_token: set[str] = set()


def forget_tokens() -> None:
    """Forget which supervisors still take the shared token (tests)."""
    with _tokens_lock:
        _on_shared_token.clear()


def _model_selector(models: Sequence[str] | None) -> list[tuple[str, str]]:
    """The original's selector: one `model` query parameter per name, a lone "" for none."""
    if models is None:
        return []
    names = list(dict.fromkeys(models)) or [""]
    params = [("model", n) for n in names]
    if len(urlencode(params)) > MAX_SELECTOR_CHARS:
        return []
    return params


def gpu_facts_unavailable(error: CallError | None) -> bool:
    """Whether a `/v1/gpu/memory` error is the supervisor saying it has no GPU facts (501: no
    NVML on that host), which is an answer, not a failure."""
    return error is not None and error.kind == HTTP and error.status == 501


def _count_error(call: str, error: CallError) -> None:
    if call == "gpu_memory" and gpu_facts_unavailable(error):
        return  # a host without NVML says so on every heartbeat, by design

    fleet_metrics.SUPERVISOR_CALL_ERRORS.labels(call=call, kind=error.kind).inc()


class SupervisorClient:
    """Talk to one domain's supervisor."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None,
        fallback_token: str | None = None,
        key: str | None = None,
        allowed_hosts: Sequence[str] = (),
        http: httpx.Client | None = None,
        on_error: ErrorHook | None = _count_error,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        max_depth: int = bounded_json.DEFAULT_MAX_DEPTH,
    ) -> None:
        """`token` is sent as the bearer token; `fallback_token` (the deprecated shared one,
        during the migration only) is sent once after this supervisor refuses `token`, and
        remembered under `key` (the domain) when it is accepted. A host outside
        `allowed_hosts` (when not empty) is never called."""
        self.base_url = base_url.rstrip("/")
        self._max_bytes = max_response_bytes
        self._max_depth = max_depth
        # Never shown with credentials: messages land in events, the dashboard and logs.
        self._where = without_userinfo(self.base_url)
        self._token = token
        self._fallback = fallback_token if fallback_token != token else None
        self._key = key or self._where
        self._allowed = host_allowed(self.base_url, allowed_hosts)
        self._http = http
        self._on_error = on_error

    def status(self, *, timeout: float) -> Call[StatusReport]:
        result = self._call("status", "GET", "/v1/status", timeout, parse_status)
        if result.value is not None:
            learn_features(self.base_url, result.value.features)
        return result

    def gpu_memory(self, *, timeout: float) -> Call[GpuMemory]:
        return self._call("gpu_memory", "GET", "/v1/gpu/memory", timeout, parse_gpu_memory)

    def wake(self, *, timeout: float, gpu_index: int | None = None) -> Call[dict[str, Any]]:
        body = {"gpuIndex": gpu_index} if gpu_index is not None else {}
        return self._call("wake", "POST", "/v1/vllm/wake", timeout, parse_ack, body)

    def sleep(self, *, timeout: float, gpu_index: int | None = None) -> Call[dict[str, Any]]:
        """Ask for sleep. A supervisor that drains first (feature `sleep.drain`) is asked to
        answer within this call's budget (`?waitMs=`): `status: draining` then means the
        sleep goes on there, and the next call joins it instead of holding a call open."""
        body = {"gpuIndex": gpu_index} if gpu_index is not None else {}
        params = None
        if FEATURE_DRAIN in (learned_features(self.base_url) or ()):
            params = [("waitMs", str(max(1, int(timeout * 1000 * WAIT_SHARE))))]
        return self._call("sleep", "POST", "/v1/vllm/sleep", timeout, parse_ack, body, params)

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
        seed: int | None = None,
        adapters: Mapping[str, Sequence[str]] | None = None,
    ) -> Call[ProbeReport]:
        """Probe the named models (all when None).

        `seed` asks for a golden probe and `adapters` for one probe per LoRA adapter; both go
        only to a supervisor that advertises `probe.golden` (learned from a status read), and
        the report says whether the answers were golden, so the caller can fall back to
        "it answers" with one that does not.

        The selection always rides in the query, which the original supervisor reads (or, in
        its older releases, ignores and probes everything: the caller judges only its own
        models). The body's `models` field, which the original refuses, goes only to a
        supervisor that advertises it or, before anything is learned, once: a 400 then is
        remembered for this supervisor and the probe is resent without it, counting no error.
        """
        body: dict[str, Any] = {"prompt": prompt, "maxTokens": max_tokens, "timeoutMs": timeout_ms}
        params = _model_selector(models)
        known = learned_features(self.base_url)
        golden = seed is not None and FEATURE_PROBE_GOLDEN in (known or ())
        if golden:
            body["seed"] = seed
            if adapters:
                body["adapters"] = {m: list(names) for m, names in adapters.items() if names}
        result = self._probe_call(body, params, models, known, timeout)
        still = FEATURE_PROBE_GOLDEN in (learned_features(self.base_url) or ())
        if golden and still and result.value is not None:
            return Call(value=replace(result.value, golden=True), error=None)
        return result

    def _probe_call(
        self,
        body: dict[str, Any],
        params: list[tuple[str, str]],
        models: Sequence[str] | None,
        known: frozenset[str] | None,
        timeout: float,
    ) -> Call[ProbeReport]:
        if models is None or (known is not None and FEATURE_PROBE_MODELS not in known):
            return self._call("probe", "POST", "/v1/probe", timeout, parse_probe, body, params)
        result = self._send(
            "POST", "/v1/probe", timeout, parse_probe, {**body, "models": list(models)}, params
        )
        if result.error is not None and result.error.status == 400:
            # Refused: an original supervisor, or ours replaced by one. Remember, resend once.
            # Everything beyond the original contract goes, golden fields included.
            learn_features(
                self.base_url,
                (known or frozenset()) - {FEATURE_PROBE_MODELS, FEATURE_PROBE_GOLDEN},
            )
            plain = {k: v for k, v in body.items() if k not in ("seed", "adapters")}
            return self._call("probe", "POST", "/v1/probe", timeout, parse_probe, plain, params)
        if result.error is not None and self._on_error is not None:
            self._on_error("probe", result.error)
        return result

    def _call(
        self,
        name: str,
        method: str,
        path: str,
        timeout: float,
        parse: Callable[[Any], T],
        body: dict[str, Any] | None = None,
        params: list[tuple[str, str]] | None = None,
    ) -> Call[T]:
        result = self._send(method, path, timeout, parse, body, params)
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
        params: list[tuple[str, str]] | None = None,
    ) -> Call[Any]:
        where = f"{method} {self._where}{path}"
        if not self._allowed:
            return Call(
                error=CallError(
                    REFUSED,
                    f"{where}: not called: the host is not in HARU_SUPERVISOR_HOSTS, and a "
                    "supervisor token is only sent to an allowed host",
                )
            )
        http = self._http or _shared_http()
        url = self.base_url + path
        budget = max(MIN_CALL_S, timeout)
        # `budget` bounds the whole exchange (connect, headers, body), not each read; a retry
        # with the fallback token shares it.
        try:
            with deadline(budget) as at:
                for token in self._tokens():
                    # Ask for the body as sent: a compressed one could inflate past the cap.
                    headers = {"Accept-Encoding": "identity"}
                    if token:
                        headers["Authorization"] = f"Bearer {token}"
                    read = self._exchange(http, method, url, body, params, headers, at, where)
                    if not (isinstance(read, tuple) and read[0] in (401, 403)):
                        self._learn_token(token)
                        break
        except httpx.TimeoutException:
            return Call(error=CallError(TIMEOUT, f"{where} timed out after {budget:.1f}s"))
        except httpx.ConnectError as exc:
            text = scrub_urls(f"{exc}")
            return Call(
                error=CallError(
                    NETWORK,
                    f"{where}: {type(exc).__name__}: {text}",
                    refused=connection_refused(exc),
                )
            )
        except httpx.HTTPError as exc:
            # The exception text names the URL and the OS error, never our headers.
            text = scrub_urls(f"{exc}")
            return Call(error=CallError(NETWORK, f"{where}: {type(exc).__name__}: {text}"))
        except Exception as exc:  # noqa: BLE001 - a broken transport must not abort a tick
            return Call(error=CallError(NETWORK, f"{where}: {type(exc).__name__}"))
        if isinstance(read, CallError):
            return Call(error=read)
        status, raw = read
        if status in (401, 403):
            return Call(
                error=CallError(
                    UNAUTHORIZED,
                    f"{where}: supervisor refused our token (HTTP {status})",
                    status=status,
                )
            )
        refused: str | None = None
        try:
            payload = bounded_json.loads(raw, max_depth=self._max_depth) if raw.strip() else None
        except ValueError as exc:
            payload, refused = None, str(exc)
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
            why = f"body is not JSON ({refused})" if refused else "body is not JSON"
            return Call(error=CallError(BAD_BODY, f"{where}: {why}"[:500], status))
        try:
            return Call(value=parse(payload))
        except BadBody as exc:
            return Call(error=CallError(BAD_BODY, f"{where}: {exc}"[:500], status))

    def _tokens(self) -> list[str | None]:
        """The tokens to present, in order: the domain's own first, unless this supervisor was
        last seen taking only the shared one."""
        if self._fallback is None:
            return [self._token]
        with _tokens_lock:
            shared_first = self._key in _on_shared_token
        if shared_first:
            return [self._fallback, self._token]
        return [self._token, self._fallback]

    def _learn_token(self, accepted: str | None) -> None:
        if self._fallback is None:
            return
        shared = accepted == self._fallback
        with _tokens_lock:
            if shared:
                _on_shared_token.add(self._key)
            else:
                _on_shared_token.discard(self._key)
        if shared:
            warn_once(
                f"shared-token:{self._key}",
                f"supervisor {self._where} (domain {self._key}) refused its own token and "
                f"accepted the shared {LEGACY_TOKEN_ENV}: give it its own "
                "(manage.py supervisor_token <fleet>/<domain>), then unset the shared one",
            )

    def _exchange(
        self,
        http: httpx.Client,
        method: str,
        url: str,
        body: Any,
        params: list[tuple[str, str]] | None,
        headers: dict[str, str],
        at: float,
        where: str,
    ) -> tuple[int, bytes] | CallError:
        """Send the request and read the body, refusing one past the size cap before it is
        all read (a declared length at once, a chunked one as it arrives)."""
        cap = self._max_bytes
        with http.stream(
            method,
            url,
            json=body if method == "POST" else None,
            params=urlencode(params) if params else None,
            headers=headers,
            timeout=max(MIN_CALL_S, at - time.monotonic()),
        ) as response:
            status = response.status_code
            if status in (401, 403):
                return status, b""  # refused: what it says is not worth reading
            too_big = CallError(BAD_BODY, f"{where}: body exceeds {cap} bytes", status)
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > cap:
                return too_big
            if response.headers.get("content-encoding", "identity").lower() != "identity":
                return CallError(BAD_BODY, f"{where}: body is encoded; identity asked", status)
            chunks: list[bytes] = []
            size = 0
            # Identity only (checked above), so these are the bytes as sent.
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > cap:
                    return too_big
                if time.monotonic() > at:
                    # An injected transport bypasses the socket-level deadline.
                    raise httpx.ReadTimeout("the call's overall deadline passed")
                chunks.append(chunk)
        return status, b"".join(chunks)


def _envelope(payload: Any) -> tuple[str | None, str]:
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        err = payload["error"]
        code = err.get("code") if isinstance(err.get("code"), str) else None
        message = err.get("message") if isinstance(err.get("message"), str) else ""
        return code, message[:300]
    return None, ""


def connection_refused(exc: BaseException) -> bool:
    """Tell whether a failed connect was refused (nothing listens: the process is gone).

    httpx raises ConnectError for a refusal but also for a failed name lookup or an unreachable
    network, which a partition can produce too; only a refusal is evidence of a dead host's
    processes, so the others count as "unavailable" and keep the stale window.
    """
    seen: BaseException | None = exc
    for _ in range(8):  # the cause chain is short; the bound guards a cycle
        if seen is None:
            break
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return "refused" in str(exc).lower()


def call_reach(call: Call[Any]) -> Reach:
    """How a supervisor call ended, in the terms of fleets.core.model_health."""
    err = call.error
    if err is None:
        return Reach.ANSWERED
    if err.refused:
        return Reach.REFUSED
    if err.kind == TIMEOUT:
        return Reach.TIMEOUT
    return Reach.UNAVAILABLE


def serving_reach(serving_url: str, *, timeout: float) -> Reach:
    """Ask a model server itself whether it serves: `GET <servingUrl>/health`, bounded.

    Used when its supervisor cannot say. No credentials go with it (vLLM's /health needs none)
    and the body is never read. Any answer below 500 means a live server; 5xx means it says it
    cannot serve; a refused connection means nothing listens there.
    """
    url = serving_url.rstrip("/") + "/health"
    budget = max(MIN_CALL_S / 5, timeout)
    try:
        with (
            deadline(budget) as at,
            _shared_http().stream(
                "GET",
                url,
                headers={"Accept-Encoding": "identity"},
                timeout=max(0.01, at - time.monotonic()),
            ) as response,
        ):
            status = response.status_code
    except httpx.TimeoutException:
        return Reach.TIMEOUT
    except httpx.ConnectError as exc:
        return Reach.REFUSED if connection_refused(exc) else Reach.UNAVAILABLE
    except Exception:  # noqa: BLE001 - a reset mid-answer: a server in trouble, not a dead one
        return Reach.UNAVAILABLE
    return Reach.UNAVAILABLE if status >= 500 else Reach.ANSWERED


def client_for(domain: Domain) -> SupervisorClient:
    """Return a client for one domain's supervisor, with that domain's token."""
    credentials = credentials_for(domain.id)
    return SupervisorClient(
        domain.supervisor_url,
        token=credentials.token,
        fallback_token=credentials.fallback,
        key=str(domain.id),
        allowed_hosts=haru_settings().supervisor_hosts,
        max_response_bytes=haru_settings().supervisor_max_response_bytes,
        max_depth=haru_settings().json_max_depth,
    )
