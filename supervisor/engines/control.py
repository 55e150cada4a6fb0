"""How the supervisor puts each kind of model server to sleep and wakes it: the capabilities.

All calls go to 127.0.0.1:<port>; these endpoints are unauthenticated and must never be
reachable from outside the host.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from common.wire.codec import to_wire
from supervisor.engines.launch import LOOPBACK

# vLLM's sleep and wake move weights between GPU and CPU memory; large models take seconds.
SLEEP_WAKE_TIMEOUT_S = 120.0
# A status read is a cheap flag lookup; anything slower means the server is in trouble.
STATUS_TIMEOUT_S = 5.0


class ControlError(Exception):
    """A sleep, wake or status call failed; the message says how, for the 502 body."""


@dataclass(frozen=True)
class SleepCapability:
    """What an engine can do about standby, declared so status can report it."""

    # "vllm": HTTP sleep/wake with a status endpoint; "sglang": release/resume memory, no
    # status endpoint; "stop": no sleep at all, so standby stops the process.
    mode: str
    levels: tuple[int, ...]
    sleep: str
    wake: str
    status: str | None
    # "warm": weights come back from CPU memory; "cold-start": the server loads from scratch.
    wake_kind: str

    def describe(self) -> dict[str, Any]:
        return to_wire(self)


class ServerControl(Protocol):
    """Sleep, wake and read the sleep flag of a server on 127.0.0.1:port."""

    capability: SleepCapability

    async def sleep(self, http: httpx.AsyncClient, port: int) -> None: ...

    async def wake(self, http: httpx.AsyncClient, port: int) -> None: ...

    async def is_sleeping(self, http: httpx.AsyncClient, port: int) -> bool | None: ...


def base_url(port: int) -> str:
    return f"http://{LOOPBACK}:{port}"


async def _post(http: httpx.AsyncClient, url: str, *, what: str, **kwargs: Any) -> None:
    try:
        response = await asyncio.wait_for(
            http.post(url, timeout=SLEEP_WAKE_TIMEOUT_S, **kwargs), SLEEP_WAKE_TIMEOUT_S
        )
    except (TimeoutError, httpx.TimeoutException) as exc:
        raise ControlError(f"{what} timed out after {SLEEP_WAKE_TIMEOUT_S:.0f}s") from exc
    except httpx.HTTPError as exc:
        raise ControlError(f"{what} failed: {describe_http_error(exc)}") from exc
    if response.status_code >= 300:
        raise ControlError(f"{what} returned HTTP {response.status_code}: {snippet(response)}")


class VllmControl:
    """vLLM's dev-mode endpoints: POST /sleep?level=1, POST /wake_up, GET /is_sleeping."""

    capability = SleepCapability(
        mode="vllm",
        levels=(1,),
        sleep="POST /sleep?level=1",
        wake="POST /wake_up",
        status="GET /is_sleeping",
        wake_kind="warm",
    )

    async def sleep(self, http: httpx.AsyncClient, port: int) -> None:
        # Level 1 only: level 2 drops the weights, and waking then needs a reload that some
        # releases skip silently, serving garbage. vLLM aborts whatever still runs (the drain
        # before this call is what lets running requests finish).
        await _post(http, f"{base_url(port)}/sleep", what="sleep", params={"level": "1"})

    async def sleep_after_running(self, http: httpx.AsyncClient, port: int) -> None:
        """Sleep once the running requests finish (`mode=wait`): the drain for a server
        whose metrics do not say what it runs."""
        params = {"level": "1", "mode": "wait"}
        await _post(http, f"{base_url(port)}/sleep", what="sleep", params=params)

    async def wake(self, http: httpx.AsyncClient, port: int) -> None:
        await _post(http, f"{base_url(port)}/wake_up", what="wake")

    async def is_sleeping(self, http: httpx.AsyncClient, port: int) -> bool | None:
        try:
            response = await asyncio.wait_for(
                http.get(f"{base_url(port)}/is_sleeping", timeout=STATUS_TIMEOUT_S),
                STATUS_TIMEOUT_S,
            )
        except TimeoutError as exc:
            raise ControlError(f"is_sleeping timed out after {STATUS_TIMEOUT_S:.0f}s") from exc
        except httpx.HTTPError as exc:
            raise ControlError(f"is_sleeping failed: {describe_http_error(exc)}") from exc
        if response.status_code != 200:
            raise ControlError(f"is_sleeping returned HTTP {response.status_code}")
        try:
            value = response.json().get("is_sleeping")
        except (ValueError, AttributeError):
            return None
        # Anything but a real boolean is unknown: "false" or 0 must not read as awake.
        return value if isinstance(value, bool) else None


class SglangControl:
    """SGLang's memory occupation endpoints; there is no endpoint that reports the state."""

    capability = SleepCapability(
        mode="sglang",
        levels=(1,),
        sleep="POST /release_memory_occupation",
        wake="POST /resume_memory_occupation",
        status=None,
        wake_kind="warm",
    )

    async def sleep(self, http: httpx.AsyncClient, port: int) -> None:
        await _post(http, f"{base_url(port)}/release_memory_occupation", what="sleep", json={})

    async def wake(self, http: httpx.AsyncClient, port: int) -> None:
        await _post(http, f"{base_url(port)}/resume_memory_occupation", what="wake", json={})

    async def is_sleeping(self, http: httpx.AsyncClient, port: int) -> bool | None:
        return None


class StopControl:
    """Engines without sleep: standby stops the process and wake is a cold start.

    The model server layer does the stopping and starting; these methods only exist so the
    protocol is uniform, and refuse to act on a server the supervisor does not manage.
    """

    capability = SleepCapability(
        mode="stop",
        levels=(),
        sleep="stop the server process",
        wake="start the server process (cold start)",
        status=None,
        wake_kind="cold-start",
    )

    async def sleep(self, http: httpx.AsyncClient, port: int) -> None:
        raise ControlError("this engine cannot sleep; only a managed server can be stopped")

    async def wake(self, http: httpx.AsyncClient, port: int) -> None:
        raise ControlError("this engine cannot wake; only a managed server can be started")

    async def is_sleeping(self, http: httpx.AsyncClient, port: int) -> bool | None:
        return None


# How often a drain asks the server how many requests it still runs.
DRAIN_POLL_S = 0.1
# vLLM's metrics page is a few hundred lines; a drain reads no more than this of it.
MAX_METRICS_CHARS = 1_000_000


@dataclass(frozen=True)
class DrainResult:
    """How a drain ended: `supported` False when the server's metrics cannot say."""

    supported: bool
    drained: bool
    waited_ms: int
    running: int = 0


_RUNNING = re.compile(r"^vllm:num_requests_(running|waiting)(?:\{[^}]*\})? ([0-9.eE+]+)$", re.M)


async def read_running(http: httpx.AsyncClient, port: int) -> int | None:
    """Requests vLLM is running or has queued, from `GET /metrics`; None when it cannot say.

    Not `/load`: vLLM answers it with 0 unless started with `--enable-server-load-tracking`.
    """
    try:
        response = await asyncio.wait_for(
            http.get(f"{base_url(port)}/metrics", timeout=STATUS_TIMEOUT_S), STATUS_TIMEOUT_S
        )
    except (TimeoutError, httpx.HTTPError):
        return None
    if response.status_code != 200:
        return None
    found = _RUNNING.findall(response.text[:MAX_METRICS_CHARS])
    if not found:
        return None
    return int(sum(float(value) for _, value in found))


# What a caller's stated budget keeps for the sleep itself once the drain ends: vLLM's level-1
# sleep moves the weights to host memory, seconds on a large model. A quarter of the budget,
# from 1 to 10 s.
SLEEP_RESERVE_MIN_S = 1.0
SLEEP_RESERVE_MAX_S = 10.0


def drain_deadline(now: float, budget_s: float) -> float:
    """When a drain must end (monotonic) for a sleep asked at `now` to be done within
    `budget_s`: the one rule for any caller that states how long it waits (a control plane's
    sleep step with `?budgetMs=`, a migration moving streams off the server)."""
    reserve = min(SLEEP_RESERVE_MAX_S, max(SLEEP_RESERVE_MIN_S, budget_s / 4))
    return now + max(0.0, budget_s - reserve)


async def drain(
    http: httpx.AsyncClient, port: int, until: Callable[[], float], clock: Any
) -> DrainResult:
    """Wait until the server reports nothing running, at most until `until()` (a monotonic
    time, read at each poll: a caller may bring it forward while the drain runs)."""
    started = clock.monotonic()
    running = await read_running(http, port)
    if running is None:
        return DrainResult(supported=False, drained=False, waited_ms=0)
    while running and clock.monotonic() < until():
        await clock.sleep(DRAIN_POLL_S)
        running = await read_running(http, port)
        if running is None:
            break
    waited = int((clock.monotonic() - started) * 1000)
    return DrainResult(supported=True, drained=running == 0, waited_ms=waited, running=running or 0)


def describe_http_error(exc: httpx.HTTPError) -> str:
    """Name a transport failure briefly (connection refused, timeout...)."""
    if isinstance(exc, httpx.ConnectError):
        return "connection refused (is the server running?)"
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    text = str(exc) or type(exc).__name__
    return text[:200]


def snippet(response: httpx.Response, limit: int = 200) -> str:
    """Quote the start of an error body; enough to diagnose, too short to flood a log."""
    try:
        text = response.text
    except Exception:  # a body that is not text is still worth a status line
        return "(unreadable body)"
    text = " ".join(text.split())
    return text[:limit] if text else "(empty body)"
