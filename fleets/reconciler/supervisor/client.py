"""The server's side of the supervisor wire contract (docs/design.md, "Supervisor contract").

`SupervisorClient` names each call (status, GPU memory, wake, sleep, training, probe) and what
it learns from the answers (a supervisor's features); `transport.py` sends them and classifies
what goes wrong; `reports.py` checks the bodies against the contract and reads them into the
report model. Every call returns a `Call` and none raises on a bad answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlencode

import httpx

from common.loopback import is_loopback_url
from common.wire.shape import (
    FEATURE_DRAIN,
    FEATURE_DRAIN_BOUND,
    FEATURE_MODEL_SWAP,
    FEATURE_PROBE_GOLDEN,
    FEATURE_PROBE_MODELS,
)
from fleets.base.conf import haru_settings
from fleets.base.supervisor_tokens import credentials_for, warn_once
from fleets.core.report import GpuMemory, StatusReport
from fleets.core.supervisor_tls import PLAIN_HTTP
from fleets.metrics import reconcile as fleet_metrics
from fleets.reconciler.supervisor.peers import learn_features, learned_features
from fleets.reconciler.supervisor.reports import (
    AdaptersListing,
    LoadAck,
    ProbeReport,
    parse_ack,
    parse_adapters,
    parse_gpu_memory,
    parse_load,
    parse_probe,
    parse_status,
)
from fleets.reconciler.supervisor.transport import (
    HTTP,
    MIN_CALL_S,
    NETWORK,
    REFUSED,
    TIMEOUT,
    Call,
    CallError,
    Door,
    TlsTrust,
    _pinned_http,
    _shared_http,
)

if TYPE_CHECKING:
    from fleets.models import Domain

T = TypeVar("T")

# A held sleep answers within this share of the call's budget, leaving the rest for the answer.
WAIT_SHARE = 0.8
# A selector longer than this goes unsent (the original's client has the same cap): request
# lines that long break proxies, and the caller judges its own models from the results anyway.
MAX_SELECTOR_CHARS = 4096

ErrorHook = Callable[[str, CallError], None]

# The supervisor's adapter API (docs/adapters.md), listed in its `features`. Declared here until
# common/wire/shape.py lists it with the others.
FEATURE_ADAPTERS = "adapters"


def _model_selector(models: Sequence[str] | None) -> list[tuple[str, str]]:
    """The original's selector: one `model` query parameter per name, a lone "" for none."""
    if models is None:
        return []
    names = list(dict.fromkeys(models)) or [""]
    params = [("model", n) for n in names]
    if len(urlencode(params)) > MAX_SELECTOR_CHARS:
        return []
    return params


def _until_cut(response: httpx.Response) -> Iterator[bytes]:
    """The body's blocks until it ends or the connection breaks: a cut stream is a short
    read (the relay sends what came, and the next tick resumes from there), never a raise."""
    try:
        yield from response.iter_bytes()
    except httpx.HTTPError:
        return


def gpu_facts_unavailable(error: CallError | None) -> bool:
    """Whether a `/v1/gpu/memory` error is the supervisor saying it has no GPU facts (501: no
    NVML on that host), which is an answer, not a failure."""
    return error is not None and error.kind == HTTP and error.status == 501


def _count_error(call: str, error: CallError) -> None:
    if call == "gpu_memory" and gpu_facts_unavailable(error):
        return  # a host without NVML says so on every heartbeat, by design

    fleet_metrics.SUPERVISOR_CALL_ERRORS.labels(call=call, kind=error.kind).inc()


class SupervisorClient(Door):
    """Talk to one domain's supervisor: the wire contract's calls, sent through its door."""

    def __init__(
        self, base_url: str, *, on_error: ErrorHook | None = _count_error, **door: Any
    ) -> None:
        """`door`: the token, the fallback token, the allowed hosts, the HTTP client and the caps
        (see `transport.Door`); `on_error` hears every failed call by name (the error counter
        by default)."""
        super().__init__(base_url, **door)
        self._on_error = on_error

    def status(self, *, timeout: float) -> Call[StatusReport]:
        result = self._call("status", "GET", "/v1/status", timeout, parse_status, reuse=True)
        if result.value is not None:
            learn_features(self.base_url, result.value.features)
        return result

    def gpu_memory(self, *, timeout: float) -> Call[GpuMemory]:
        return self._call(
            "gpu_memory", "GET", "/v1/gpu/memory", timeout, parse_gpu_memory, reuse=True
        )

    def wake(self, *, timeout: float, gpu_index: int | None = None) -> Call[dict[str, Any]]:
        body = {"gpuIndex": gpu_index} if gpu_index is not None else {}
        return self._call("wake", "POST", "/v1/vllm/wake", timeout, parse_ack, body)

    def sleep(
        self,
        *,
        timeout: float,
        gpu_index: int | None = None,
        budget: float | None = None,
        drain_bound_ms: int | None = None,
    ) -> Call[dict[str, Any]]:
        """Ask for sleep. A supervisor that drains first (feature `sleep.drain`) is asked to
        answer within this call's budget (`?waitMs=`): `status: draining` then means the
        sleep goes on there, and the next call joins it instead of holding a call open. With
        `budget` (seconds the caller still waits for the sleep: what is left of its step) it
        is told that too (`?budgetMs=`), and ends its drain in time for the sleep to fit.
        With `drain_bound_ms`, one that lists `drain-bound` ends its drain that long after the
        call (0: at once) and aborts what still runs (`?drainMs=`); any other is not sent it."""
        body = {"gpuIndex": gpu_index} if gpu_index is not None else {}
        params: list[tuple[str, str]] = []
        known = learned_features(self.base_url) or frozenset()
        if FEATURE_DRAIN in known:
            params.append(("waitMs", str(max(1, int(timeout * 1000 * WAIT_SHARE)))))
            if budget is not None:
                params.append(("budgetMs", str(max(1, int(budget * 1000)))))
        if drain_bound_ms is not None and FEATURE_DRAIN_BOUND in known:
            params.append(("drainMs", str(drain_bound_ms)))
        return self._call(
            "sleep", "POST", "/v1/vllm/sleep", timeout, parse_ack, body, params or None
        )

    def takes_drain_bound(self) -> bool:
        """Whether this supervisor listed `drain-bound` in its last status read here."""
        return FEATURE_DRAIN_BOUND in (learned_features(self.base_url) or ())

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

    def takes_swap(self) -> bool | None:
        """Whether this supervisor listed `model.swap` in its last status read here (None:
        nothing learned yet; read the status first)."""
        known = learned_features(self.base_url)
        return None if known is None else FEATURE_MODEL_SWAP in known

    def model_swap(
        self,
        *,
        model: str,
        profile: Mapping[str, Any],
        mode: str,
        timeout: float,
        start_timeout_ms: int | None = None,
    ) -> Call[dict[str, Any]]:
        """Ask the supervisor to start `model` from `profile` and switch its name to it
        (`POST /v1/models/swap`, ours only: feature `model.swap`). Answers 202 at once; the
        progress is the model's `swap` in the status report (`swap_progress`)."""
        body: dict[str, Any] = {"model": model, "profile": dict(profile), "mode": mode}
        if start_timeout_ms is not None:
            body["startTimeoutMs"] = start_timeout_ms
        return self._call("model_swap", "POST", "/v1/models/swap", timeout, parse_ack, body)

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
        result = self.send(
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

    # -- the adapter API (docs/adapters.md, "The supervisor's adapter API") ---------------------

    def takes_adapters(self) -> bool:
        """Whether this supervisor listed `adapters` in its last status read here."""
        return FEATURE_ADAPTERS in (learned_features(self.base_url) or ())

    def adapters_list(self, *, timeout: float) -> Call[AdaptersListing]:
        return self._call("adapters_list", "GET", "/v1/adapters", timeout, parse_adapters)

    def adapter_commit(self, *, store_id: str, digest: str, timeout: float) -> Call[dict[str, Any]]:
        path = f"/v1/adapters/{quote(store_id, safe='')}/commit"
        return self._call("adapter_commit", "POST", path, timeout, parse_ack, {"digest": digest})

    def adapter_load(
        self, *, model: str, name: str, store_id: str, timeout: float
    ) -> Call[LoadAck]:
        body = {"model": model, "name": name, "id": store_id}
        return self._call("adapter_load", "POST", "/v1/adapters/load", timeout, parse_load, body)

    def adapter_unload(self, *, model: str, name: str, timeout: float) -> Call[dict[str, Any]]:
        body = {"model": model, "name": name}
        return self._call("adapter_unload", "POST", "/v1/adapters/unload", timeout, parse_ack, body)

    def adapter_delete(self, *, store_id: str, timeout: float) -> Call[dict[str, Any]]:
        path = f"/v1/adapters/{quote(store_id, safe='')}"
        return self._call("adapter_delete", "DELETE", path, timeout, parse_ack)

    def _raw_http(self) -> httpx.Client:
        pin = self._tls.pin
        return self._http or (_pinned_http(pin) if pin else _shared_http())

    def _raw_refusal(self, where: str) -> CallError | None:
        if not self._allowed:
            return CallError(
                REFUSED, f"{where}: not called: the host is not in HARU_SUPERVISOR_HOSTS"
            )
        if self._refusal is not None:
            return CallError(REFUSED, f"{where}: not called: {self._refusal}")
        return None

    def _raw_headers(self) -> dict[str, str]:
        # Adapter routes are ours only: the domain's own token (never the shared fallback).
        headers = {"Accept-Encoding": "identity"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    @contextmanager
    def adapter_file(
        self, *, store_id: str, path: str, offset: int, timeout: float
    ) -> Iterator[tuple[Iterator[bytes] | None, CallError | None]]:
        """Stream one stored file from byte `offset` (`Range: bytes=N-`): yields the body's
        blocks as they arrive (never the whole file in memory), or the error."""
        url_path = f"/v1/adapters/{quote(store_id, safe='')}/files/{quote(path, safe='')}"
        where = f"GET {self.where}{url_path}"
        refused = self._raw_refusal(where)
        if refused is not None:
            yield None, refused
            return
        headers = self._raw_headers()
        if offset:
            headers["Range"] = f"bytes={offset}-"
        opened = self._raw_http().stream(
            "GET", self.where + url_path, headers=headers, timeout=max(MIN_CALL_S, timeout)
        )
        try:
            response = opened.__enter__()
        except httpx.TimeoutException:
            yield None, CallError(TIMEOUT, f"{where} timed out")
            return
        except httpx.HTTPError as exc:
            yield None, CallError(NETWORK, f"{where}: {type(exc).__name__}")
            return
        try:
            status = response.status_code
            if status not in (200, 206) or (offset and status != 206):
                yield None, CallError(HTTP, f"{where}: HTTP {status}", status)
                return
            yield _until_cut(response), None
        finally:
            opened.__exit__(None, None, None)

    def adapter_put(
        self, *, store_id: str, path: str, offset: int, data: bytes, timeout: float
    ) -> Call[dict[str, Any]]:
        """Append `data` (one chunk, under the supervisor's cap) at byte `offset` of the
        incoming copy; 409 `offset_mismatch` says what it holds instead."""
        url_path = f"/v1/adapters/{quote(store_id, safe='')}/files/{quote(path, safe='')}"
        where = f"PUT {self.where}{url_path}"
        refused = self._raw_refusal(where)
        if refused is not None:
            return Call(error=refused)
        try:
            response = self._raw_http().request(
                "PUT",
                self.where + url_path,
                params={"offset": str(offset)},
                content=data,
                headers={**self._raw_headers(), "Content-Type": "application/octet-stream"},
                timeout=max(MIN_CALL_S, timeout),
            )
            body = response.read()[: self._max_bytes]
        except httpx.TimeoutException:
            return Call(error=CallError(TIMEOUT, f"{where} timed out"))
        except httpx.HTTPError as exc:
            return Call(error=CallError(NETWORK, f"{where}: {type(exc).__name__}"))
        result = self._answer((response.status_code, body), parse_ack, where, reuse=False)
        if result.error is not None and self._on_error is not None:
            self._on_error("adapter_put", result.error)
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
        *,
        reuse: bool = False,
    ) -> Call[T]:
        result = self.send(method, path, timeout, parse, body, params, reuse=reuse)
        if result.error is not None and self._on_error is not None:
            self._on_error(name, result.error)
        return result


def client_for(domain: Domain) -> SupervisorClient:
    """Return a client for one domain's supervisor, with that domain's token and TLS trust."""
    credentials = credentials_for(domain.id)
    url = domain.supervisor_url
    if domain.supervisor_transport == PLAIN_HTTP and url and not is_loopback_url(url):
        warn_once(
            f"plain-http:{domain.id}",
            f"domain {domain.slug}'s supervisor is called over plain HTTP beyond loopback "
            "(supervisorTransport: plain-http): its token crosses the network in clear",
        )
    return SupervisorClient(
        domain.supervisor_url,
        token=credentials.token,
        fallback_token=credentials.fallback,
        key=str(domain.id),
        allowed_hosts=haru_settings().supervisor_hosts,
        max_response_bytes=haru_settings().supervisor_max_response_bytes,
        max_depth=haru_settings().json_max_depth,
        tls=TlsTrust(domain.supervisor_transport, domain.supervisor_fingerprint, domain.slug),
    )
