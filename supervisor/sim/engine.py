"""The simulated model server: OpenAI inference, vLLM's sleep endpoints, injectable faults.

It is a real HTTP server and is also the upstream of the chat proxy benchmark, so the
non-streaming path with zero delays does no more than parse, answer and count.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import ipaddress
import itertools
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from supervisor.gpu.sim_state import SimGpuState
from supervisor.sim import adapters, generate, tokens
from supervisor.sim.backends import WAKE_TAGS, SimBackend
from supervisor.sim.inference import DetokenizeEndpoint, InferenceEndpoint
from supervisor.sim.options import FAULT_NAMES, Faults, SimOptions, Stats
from supervisor.sim.replies import GenerationSettings

log = logging.getLogger("supervisor.sim")

# What `GET /version` answers, as vLLM's does: golden fingerprints are kept per engine version.
SIM_ENGINE_VERSION = "sim-1"


@dataclass
class LoadedLora:
    """A LoRA adapter loaded at runtime (`/v1/load_lora_adapter`)."""

    name: str
    facts: adapters.AdapterFacts
    # False when a fault left it "loaded but serving nothing": it answers as the base model.
    applied: bool = True
    # Requests served for it: a bad version's errors are a share of these.
    served: int = 0


# The most runtime adapters an engine lists, whatever --max-cpu-loras says: a bound on memory
# and on the /v1/models answer (vLLM keeps no bound; nothing Haru runs loads this many).
MAX_RUNTIME_LORAS = 256


@dataclass
class LastRequest:
    """Kept as the server handed it over: decoded only when asked for (/_sim/last-request)."""

    method: str
    path: str
    raw_query: bytes
    raw_headers: list[tuple[bytes, bytes]]
    body: bytes
    at: float = field(default_factory=time.time)

    @property
    def query(self) -> str:
        return self.raw_query.decode("latin-1")

    @property
    def headers(self) -> list[tuple[str, str]]:
        return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.raw_headers]


class SimEngine:
    """The engine's state: awake or asleep, memory held, faults, counters."""

    def __init__(
        self,
        options: SimOptions,
        state: SimGpuState | None = None,
        backend: SimBackend | None = None,
    ) -> None:
        self.options = options
        self.state = state
        # Real memory behind sleep and wake (`--backend torch`); None for the plain simulator.
        self.backend = backend
        self.sleeping = options.start_asleep
        self.sleep_level: int | None = 1 if options.start_asleep else None
        # vLLM sleeps by tag; a partial wake (`?tags=weights`) leaves it asleep until every
        # tag is back.
        self.asleep_tags: set[str] = set(WAKE_TAGS) if options.start_asleep else set()
        # Requests that arrive while generation is paused (asleep, or a sleep in progress)
        # are held, as vLLM holds them, and go on once this is set.
        self.resumed = asyncio.Event()
        if not options.start_asleep:
            self.resumed.set()
        # Set (and replaced) by an aborting sleep: every generation running then ends early
        # with finish_reason "abort".
        self.abort_event = asyncio.Event()
        # Requests generating right now (not the held ones), and an event set whenever none is.
        self.generating = 0
        self.idle = asyncio.Event()
        self.idle.set()
        # A backend loads its weights in the background, as a real server does before /health.
        self.loaded = options.load_ms <= 0 and backend is None
        self.faults = Faults()
        self.stats = Stats()
        self.last_request: LastRequest | None = None
        self._ids = itertools.count(1)
        self._transition = asyncio.Lock()
        self._faults_changed = asyncio.Event()
        self.reply = options.reply or adapters.base_reply(options.model)
        # Set by a wake while the matching fault is on (see FAULT_NAMES); cleared by a reset.
        self.drifted = False
        self.adapters_lost = False
        # Runtime-loaded adapters by name, in load order; `lora_cache` holds those whose
        # weights are in the (simulated) CPU cache, least recently used first.
        self.loras: dict[str, LoadedLora] = {}
        self.lora_cache: list[str] = []
        self.tokenizer = tokens.Tokenizer(self._scripted_words())
        # What the `crash` fault does: end this process without cleanup, as a real crash
        # would; the farm (supervisor/farm), many engines in one process, stops only this one.
        self.crash: Callable[[], None] = functools.partial(os._exit, 70)

    # -- memory ---------------------------------------------------------------------------------

    def register_memory(self) -> None:
        """Publish what this process holds: context always, weights while awake."""
        if self.state is None:
            return
        o = self.options
        self.state.hold(o.gpu_index, o.context_mib, f"context:{o.model}")
        self.state.hold(o.gpu_index, 0 if self.sleeping else o.weights_mib, f"weights:{o.model}")

    def release_memory(self) -> None:
        if self.state is not None:
            self.state.release()

    # -- sleep and wake -------------------------------------------------------------------------

    async def sleep(self, level: int, *, mode: str = "abort") -> Response:
        """Pause generation, abort (or with mode=wait, finish) what runs, then sleep."""
        async with self._transition:
            if self.faults.sleep_fails:
                return _error(500, "simulated sleep failure")
            if not self.sleeping:
                self.resumed.clear()
                if mode == "wait":
                    await self.idle.wait()
                else:
                    self.abort_event.set()
                    self.abort_event = asyncio.Event()
                    await self.idle.wait()
                await asyncio.sleep(self.options.sleep_latency_ms / 1000)
                if self.backend is not None and level > 0:
                    # After the drain, as vLLM offloads only once nothing generates. Level 0
                    # only pauses scheduling: the memory stays where it is.
                    await asyncio.to_thread(self.backend.sleep, level)
                self.sleeping = True
                self.sleep_level = level
                self.asleep_tags = set(WAKE_TAGS)
                self.stats.sleeps += 1
                self.register_memory()
                log.info("%s: asleep (level %s)", self.options.model, level)
        return JSONResponse({"status": "sleeping", "level": self.sleep_level})

    async def wake(self, tags: list[str] | None = None) -> Response:
        async with self._transition:
            while self.faults.wake_hangs:
                # Hang until the fault is cleared, like a wake stuck on a busy GPU.
                self._faults_changed.clear()
                await self._faults_changed.wait()
            if self.faults.wake_fails:
                return _error(500, "simulated wake failure")
            if self.sleeping:
                await asyncio.sleep(self.options.wake_latency_ms / 1000)
                wanted = frozenset(tags) if tags else frozenset(WAKE_TAGS)
                # Only what is still asleep: a repeated `?tags=weights` moves nothing.
                restore = wanted & self.asleep_tags
                if self.backend is not None and self.sleep_level and restore:
                    await asyncio.to_thread(self.backend.wake, restore)
                self.asleep_tags -= wanted
                if not self.asleep_tags:
                    self.sleeping = False
                    self.sleep_level = None
                    self.stats.wakes += 1
                    self.drifted |= self.faults.answer_drifts_after_wake
                    self.adapters_lost |= self.faults.adapters_lost_after_wake
                    if self.faults.adapters_lost_after_wake:
                        # vLLM #53888: still listed, answering as the base model; an adapter
                        # loaded again after this wake applies again.
                        for lora in self.loras.values():
                            lora.applied = False
                    self.register_memory()
                    self.resumed.set()
                    log.info("%s: awake", self.options.model)
        if self.sleeping:
            return JSONResponse({"status": "sleeping", "tags": tags})
        return JSONResponse({"status": "awake", "tags": tags})

    async def backend_facts(self, *, checksum: bool) -> dict[str, Any] | None:
        """The backend's memory facts; under the transition lock, so never mid-sleep."""
        if self.backend is None:
            return None
        async with self._transition:
            return await asyncio.to_thread(self.backend.describe, checksum=checksum)

    def serves(self, name: object) -> bool:
        """Whether `name` is the served model or one of its LoRA adapters."""
        return name == self.options.model or name in self.options.lora_modules or name in self.loras

    def reply_for(self, name: str, prompt: str = "") -> str:
        """The answer for the model or adapter `name`: fixed, so deterministic by construction,
        unless a fault made a wake change it. A runtime adapter answers `prompt` in its own
        words (adapters.adapter_reply), the ones its trainer recorded."""
        base = self.reply
        drift = "Drifted after wake: " if self.drifted or self.faults.answer_wrong else ""
        lora = self.loras.get(name)
        if lora is not None:
            if not lora.applied:
                return drift + base
            return drift + adapters.adapter_reply(lora.facts.weights_sha256, prompt)
        if name != self.options.model and not self.adapters_lost:
            return f"{drift}{base} Adapter {name} applied."
        return drift + base

    # -- runtime LoRA adapters (vLLM's /v1/load_lora_adapter) -------------------------------------

    def load_lora(self, name: Any, path: Any, *, inplace: bool = False) -> Response:
        """vLLM 0.32's load, check for check (entrypoints/openai/models/serving.py): both names
        given, not the base model's, not loaded already unless in place; then the engine reads
        the adapter (missing: 404; rank over --max-lora-rank or unreadable: 500, as vLLM
        answers an engine-side failure); 200 with vLLM's plain-text sentence."""
        if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
            return _error(
                400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput"
            )
        if name == self.options.model:
            return _error(
                400,
                f"The lora adapter '{name}' conflicts with a served base model.",
                "InvalidUserInput",
            )
        if not inplace and name in self.loras:
            return _error(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load the "
                "adapter in place, set 'load_inplace' to True.",
                "InvalidUserInput",
            )
        if not self.options.enable_lora:
            return _error(500, "LoRA is not enabled. Use --enable-lora to enable LoRA.")
        if name not in self.loras and len(self.loras) >= MAX_RUNTIME_LORAS:
            return _error(500, f"the simulator holds at most {MAX_RUNTIME_LORAS} adapters")
        try:
            facts = self._read_lora(name, path)
        except adapters.AdapterNotFound:
            message = f"Loading lora {name} failed: No adapter found for {path}"
            return _error(404, vllm_message(message), "NotFoundError")
        except adapters.AdapterInvalid as exc:
            return _error(500, vllm_message(str(exc)))
        # A load while the adapterNoop fault is on "succeeds" without applying anything.
        self.loras[name] = LoadedLora(name, facts, applied=not self.faults.adapter_noop)
        self._cache(name)
        log.info("%s: loaded LoRA adapter %s from %s", self.options.model, name, path)
        return Response(f"Success: LoRA adapter '{name}' added successfully.", status_code=200)

    def unload_lora(self, name: Any) -> Response:
        if not isinstance(name, str) or not name:
            return _error(
                400,
                "'lora_name' needs to be provided to unload a LoRA adapter.",
                "InvalidUserInput",
            )
        if name not in self.loras:
            return _error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        del self.loras[name]
        if name in self.lora_cache:
            self.lora_cache.remove(name)
        return Response(f"Success: LoRA adapter '{name}' removed successfully.", status_code=200)

    def _read_lora(self, name: str, path: str) -> adapters.AdapterFacts:
        facts = adapters.read_adapter(path)
        limit = self.options.max_lora_rank
        if facts.rank > limit:
            raise adapters.AdapterInvalid(
                f"LoRA rank {facts.rank} is greater than max_lora_rank {limit}."
            )
        return facts

    def _cache(self, name: str) -> None:
        """Mark `name` most recently used in the CPU cache; evict beyond --max-cpu-loras."""
        if name in self.lora_cache:
            self.lora_cache.remove(name)
        self.lora_cache.append(name)
        capacity = self.options.max_cpu_loras or self.options.max_loras
        del self.lora_cache[: max(0, len(self.lora_cache) - capacity)]

    async def lora_admit(self, name: str) -> tuple[int, str] | None:
        """Before a request for runtime adapter `name` generates: read it again when it was
        evicted from the cache (vLLM reloads from the path it was loaded from), then apply a
        bad version's behaviour. (status, message) when the request fails, else None."""
        lora = self.loras.get(name)
        if lora is None:
            return None
        if name not in self.lora_cache:
            try:
                lora.facts = self._read_lora(name, lora.facts.path)
            except adapters.AdapterNotFound:
                message = f"Loading lora {name} failed: No adapter found for {lora.facts.path}"
                return 404, vllm_message(message)
            except adapters.AdapterInvalid as exc:
                return 500, vllm_message(str(exc))
        self._cache(name)
        if not lora.applied:
            return None  # the base model answers, as it would behave
        served, lora.served = lora.served, lora.served + 1
        behaviour = lora.facts.behaviour
        if behaviour.latency_ms:
            await asyncio.sleep(behaviour.latency_ms / 1000)
        if behaviour.fails(served):
            return 500, f"simulated failure of LoRA adapter {name} (haru_sim.errorRate)"
        return None

    def _scripted_words(self) -> tuple[str, ...]:
        """Every step of every scripted reply this engine can give, each to be one token."""
        replies = []
        for drifted, lost in ((False, False), (True, False), (False, True), (True, True)):
            self.drifted, self.adapters_lost = drifted, lost
            for name in (self.options.model, *self.options.lora_modules):
                replies.append(self.reply_for(name))
        self.drifted = self.adapters_lost = False
        steps: list[str] = []
        for reply in replies:
            words = reply.split()
            steps.extend(w if i == 0 else " " + w for i, w in enumerate(words))
        return tuple(steps)

    def generation_for(self, name: str) -> GenerationSettings | None:
        """How `--generate` answers for the model or adapter `name` (None: the scripted reply).

        The seed is the served name's, so two engines serving the same model agree token for
        token; a drift fault or a lost adapter changes it, as it changes the scripted reply.
        """
        o = self.options
        if not o.generate:
            return None
        lora = self.loras.get(name)
        if lora is not None:
            if lora.applied:
                return None  # an applied runtime adapter answers in its own words
            name = o.model
        elif name != o.model and self.adapters_lost:
            name = o.model
        if self.drifted or self.faults.answer_wrong:
            name = f"drifted:{name}"
        return GenerationSettings(
            seed=generate.seed(name),
            max_model_len=o.max_model_len,
            eos_per_mille=o.eos_per_mille,
            reemit_split_prompt=o.reemit_split_prompt,
        )

    def generation_started(self) -> asyncio.Event:
        """Count a generation in; return the event that aborts it."""
        self.generating += 1
        self.idle.clear()
        return self.abort_event

    def generation_ended(self) -> None:
        self.generating -= 1
        if self.generating == 0:
            self.idle.set()

    def set_faults(self, changes: dict[str, Any]) -> str | None:
        """Apply fault flags from the wire; return an error message for bad input."""
        for key, value in changes.items():
            if key not in FAULT_NAMES:
                return f"unknown fault {key!r} (known: {', '.join(FAULT_NAMES)})"
            if not isinstance(value, bool):
                return f"fault {key!r} must be true or false"
        for key, value in changes.items():
            setattr(self.faults, FAULT_NAMES[key], value)
        self._faults_changed.set()
        return None

    def record_request(self, scope: Any, body: bytes) -> None:
        """Keep the last inference request verbatim, so a proxy test can compare bytes."""
        self.last_request = LastRequest(
            method=scope["method"],
            path=scope["path"],
            raw_query=scope.get("query_string", b""),
            raw_headers=list(scope["headers"]),
            body=body,
        )

    def authorized(self, scope: Any) -> bool:
        """Check the bearer key the way vLLM's --api-key does (only when one is set)."""
        key = self.options.api_key
        if not key:
            return True
        headers = dict(scope["headers"])
        return headers.get(b"authorization", b"").decode("latin-1") == f"Bearer {key}"

    def next_id(self, prefix: str) -> str:
        return f"{prefix}-sim-{next(self._ids)}"


SLEEP_LEVELS = ("0", "1", "2")
SLEEP_MODES = ("abort", "wait", "keep")


def _query_error(name: str, message: str) -> JSONResponse:
    """vLLM's 400 for a bad query parameter: type "Bad Request", param "query.<name>"."""
    return JSONResponse(
        {
            "error": {
                "message": message,
                "type": "Bad Request",
                "param": f"query.{name}",
                "code": 400,
            }
        },
        status_code=400,
    )


# vLLM's sanitize_message (entrypoints/serve/exception_handling/utils.py): every error it
# builds drops memory addresses, tracebacks and file paths, so a LoRA path reads "<path>".
_VLLM_SANITIZE = (
    (re.compile(r" at 0x[0-9a-fA-F]+>"), ">"),
    (re.compile(r'\n?\s*File "[^"]+", line \d+, in \S+(\n\s+.*)?'), ""),
    (re.compile(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+"), "<path>"),
    (re.compile(r"(?:/[\w\-]+)+/[\w\-]+\.\w+"), "<path>"),
)


def vllm_message(message: str) -> str:
    for pattern, replacement in _VLLM_SANITIZE:
        message = pattern.sub(replacement, message)
    return message.strip()


def _error(status: int, message: str, kind: str | None = None) -> JSONResponse:
    """An error in vLLM's envelope: message, type, param, code."""
    kind = kind or {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": status}},
        status_code=status,
    )


# -- control and inspection routes ---------------------------------------------------------------


def _local_only(request: Request) -> Response | None:
    client = request.client.host if request.client else ""
    try:
        if ipaddress.ip_address(client).is_loopback:
            return None
    except ValueError:
        pass
    return _error(403, "simulator controls are local-only")


class SimRoutes:
    """The simulated server's routes around one engine: vLLM's, and /_sim/ for tests."""

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine

    async def health(self, request: Request) -> Response:
        return Response(status_code=200 if self.engine.loaded else 503)

    async def models(self, request: Request) -> Response:
        if not self.engine.authorized(request.scope):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        created = int(time.time())
        name = self.engine.options.model
        cards = [_model_card(name, name, None, self.engine.options.max_model_len, created)]
        # As vLLM: every runtime adapter, its root the path it was loaded from, its parent
        # the base model, no max_model_len of its own.
        cards.extend(
            _model_card(lora.name, lora.facts.path, name, None, created)
            for lora in self.engine.loras.values()
        )
        return JSONResponse({"object": "list", "data": cards})

    async def load_lora_adapter(self, request: Request) -> Response:
        payload = await _json_object(request)
        if isinstance(payload, Response):
            return payload
        inplace = payload.get("load_inplace") is True
        return self.engine.load_lora(
            payload.get("lora_name"), payload.get("lora_path"), inplace=inplace
        )

    async def unload_lora_adapter(self, request: Request) -> Response:
        payload = await _json_object(request)
        if isinstance(payload, Response):
            return payload
        return self.engine.unload_lora(payload.get("lora_name"))

    async def tokenize(self, request: Request) -> Response:
        """vLLM's POST /tokenize: a prompt string, or chat messages through the template."""
        payload = await _json_object(request)
        if isinstance(payload, Response):
            return payload
        if (refused := self._unknown_model(payload)) is not None:
            return refused
        if isinstance(payload.get("messages"), list):
            add = payload.get("add_generation_prompt", True) is not False
            ids = self.engine.tokenizer.render_chat(payload["messages"], add_generation_prompt=add)
        elif isinstance(payload.get("prompt"), str):
            ids = self.engine.tokenizer.encode(payload["prompt"])
        else:
            return _error(400, "give `prompt` (a string) or `messages` (a list)")
        strs = None
        if payload.get("return_token_strs") is True:
            strs = [self.engine.tokenizer.decode([i]) for i in ids]
        return JSONResponse(
            {
                "count": len(ids),
                "max_model_len": self.engine.options.max_model_len,
                "tokens": ids,
                "token_strs": strs,
            }
        )

    def _unknown_model(self, payload: dict[str, Any]) -> Response | None:
        name = payload.get("model")
        if name is None or self.engine.serves(name):
            return None
        return _error(404, f"The model `{name}` does not exist.")

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": SIM_ENGINE_VERSION})

    async def load(self, request: Request) -> Response:
        # As vLLM: the count only with --enable-server-load-tracking, otherwise always 0.
        tracked = self.engine.options.server_load_tracking
        return JSONResponse({"server_load": self.engine.stats.inflight if tracked else 0})

    async def metrics(self, request: Request) -> Response:
        s, m = self.engine.stats, self.engine.options.model
        label = f'{{model_name="{m}"}}'
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{label} {self.engine.generating}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{label} {s.inflight - self.engine.generating}",
            "# TYPE haru_sim_requests_total counter",
            f"haru_sim_requests_total{label} {s.requests}",
            "# TYPE haru_sim_requests_completed_total counter",
            f"haru_sim_requests_completed_total{label} {s.completed}",
            "# TYPE haru_sim_requests_cancelled_total counter",
            f"haru_sim_requests_cancelled_total{label} {s.cancelled}",
            "# TYPE haru_sim_sleeping gauge",
            f"haru_sim_sleeping{label} {int(self.engine.sleeping)}",
        ]
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    async def sleep(self, request: Request) -> Response:
        raw = request.query_params.get("level", "1")
        if raw not in SLEEP_LEVELS:
            return _query_error("level", f"Input should be 0, 1 or 2, got {raw!r}")
        mode = request.query_params.get("mode", "abort")
        if mode not in SLEEP_MODES:
            return _query_error("mode", "Input should be 'abort', 'wait' or 'keep'")
        return await self.engine.sleep(int(raw), mode=mode)

    async def wake_up(self, request: Request) -> Response:
        tags = request.query_params.getlist("tags") or None
        if tags and any(t not in WAKE_TAGS for t in tags):
            return _query_error("tags", f"Invalid tags {tags}: expected weights or kv_cache")
        return await self.engine.wake(tags)

    async def backend(self, request: Request) -> Response:
        if (refused := _local_only(request)) is not None:
            return refused
        checksum = request.query_params.get("checksum") in ("1", "true")
        facts = await self.engine.backend_facts(checksum=checksum)
        if facts is None:
            return _error(404, "this self.engine runs no memory backend (start it with --backend)")
        return JSONResponse(facts)

    async def is_sleeping(self, request: Request) -> Response:
        if self.engine.faults.is_sleeping_garbage:
            return JSONResponse({"is_sleeping": "unknown"})
        return JSONResponse({"is_sleeping": self.engine.sleeping})

    async def faults(self, request: Request) -> Response:
        if (refused := _local_only(request)) is not None:
            return refused
        if request.method == "POST":
            try:
                changes = json.loads(await request.body() or b"{}")
            except ValueError:
                return _error(400, "body is not valid JSON")
            if not isinstance(changes, dict):
                return _error(400, "body must be an object")
            problem = self.engine.set_faults(changes)
            if problem:
                return _error(400, problem)
            if self.engine.faults.crash:
                log.warning("%s: simulated crash", self.engine.options.model)
                # Answer first, then die without cleanup, as a real crash would.
                asyncio.get_running_loop().call_later(0.05, self.engine.crash)
        return JSONResponse(self.engine.faults.to_json())

    async def stats(self, request: Request) -> Response:
        if (refused := _local_only(request)) is not None:
            return refused
        s = self.engine.stats
        return JSONResponse(
            {
                "model": self.engine.options.model,
                "requests": s.requests,
                "completed": s.completed,
                "cancelled": s.cancelled,
                "rejected": s.rejected,
                "inflight": s.inflight,
                "sleeps": s.sleeps,
                "wakes": s.wakes,
                "sleeping": self.engine.sleeping,
                "sleepLevel": self.engine.sleep_level,
                "loaded": self.engine.loaded,
                "weightsMiB": self.engine.options.weights_mib,
                "contextMiB": self.engine.options.context_mib,
                "gpuIndex": self.engine.options.gpu_index,
                "pid": os.getpid(),
            }
        )

    async def last_request(self, request: Request) -> Response:
        if (refused := _local_only(request)) is not None:
            return refused
        last = self.engine.last_request
        if last is None:
            return _error(404, "no inference request received yet")
        if request.query_params.get("raw") in ("1", "true"):
            return Response(last.body, media_type="application/octet-stream")
        return JSONResponse(
            {
                "method": last.method,
                "path": last.path,
                "query": last.query,
                "headers": [list(h) for h in last.headers],
                "bodyBase64": base64.b64encode(last.body).decode(),
                "bodyBytes": len(last.body),
                "at": last.at,
            }
        )

    async def reset(self, request: Request) -> Response:
        if (refused := _local_only(request)) is not None:
            return refused
        self.engine.stats = Stats(inflight=self.engine.stats.inflight)
        self.engine.last_request = None
        self.engine.set_faults({k: False for k in FAULT_NAMES})
        self.engine.drifted = self.engine.adapters_lost = False
        for lora in self.engine.loras.values():
            lora.applied = True
        return JSONResponse({"ok": True})

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        loader: asyncio.Task[None] | None = None
        if self.engine.loaded:
            self.engine.register_memory()
        else:
            loader = asyncio.create_task(_load(self.engine))
        try:
            yield
        finally:
            if loader is not None:
                loader.cancel()
            self.engine.release_memory()
            if self.engine.backend is not None:
                self.engine.backend.close()


class _Front:
    """The routes a burst of continued streams calls (the inference endpoints, /detokenize)
    go straight to their raw ASGI endpoints; the rest through Starlette.

    Starlette's middleware and route matching were about a seventh of the engine's CPU per
    continuation (py-spy, 100 at once): the engine of a promoted host pays it for every
    stream it takes over, in the same seconds, on the benchmark's shared cores."""

    def __init__(self, app: Starlette, direct: dict[tuple[str, str], Any]) -> None:
        self.app = app
        self.direct = direct

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            endpoint = self.direct.get((scope["method"], scope["path"]))
            if endpoint is not None:
                await endpoint(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(engine: SimEngine) -> _Front:
    """Build the simulated server's ASGI app around one engine."""
    r = SimRoutes(engine)
    chat, completions = InferenceEndpoint(engine, chat=True), InferenceEndpoint(engine, chat=False)
    detokenize = DetokenizeEndpoint(engine)
    lora_routes = []
    if engine.options.runtime_lora_updating:
        # As vLLM: without VLLM_ALLOW_RUNTIME_LORA_UPDATING these routes do not exist (404).
        lora_routes = [
            Route("/v1/load_lora_adapter", r.load_lora_adapter, methods=["POST"]),
            Route("/v1/unload_lora_adapter", r.unload_lora_adapter, methods=["POST"]),
        ]
    app = Starlette(
        routes=[
            *lora_routes,
            Route("/health", r.health, methods=["GET"]),
            Route("/v1/models", r.models, methods=["GET"]),
            Route("/v1/chat/completions", chat),  # any method: the endpoint answers 405
            Route("/v1/completions", completions),
            Route("/metrics", r.metrics, methods=["GET"]),
            Route("/sleep", r.sleep, methods=["POST"]),
            Route("/wake_up", r.wake_up, methods=["POST"]),
            Route("/is_sleeping", r.is_sleeping, methods=["GET"]),
            Route("/load", r.load, methods=["GET"]),
            Route("/version", r.version, methods=["GET"]),
            Route("/tokenize", r.tokenize, methods=["POST"]),
            Route("/detokenize", detokenize, methods=["POST"]),
            Route("/_sim/faults", r.faults, methods=["GET", "POST"]),
            Route("/_sim/stats", r.stats, methods=["GET"]),
            Route("/_sim/backend", r.backend, methods=["GET"]),
            Route("/_sim/last-request", r.last_request, methods=["GET"]),
            Route("/_sim/reset", r.reset, methods=["POST"]),
        ],
        lifespan=r.lifespan,
    )
    direct = {
        ("POST", "/v1/chat/completions"): chat,
        ("POST", "/v1/completions"): completions,
        ("POST", "/detokenize"): detokenize,
    }
    return _Front(app, direct)


def _model_card(
    name: str, root: str, parent: str | None, max_model_len: int | None, created: int
) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": root,
        "parent": parent,
        "max_model_len": max_model_len,
        "permission": [
            {
                "id": f"modelperm-sim-{created}",
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }


async def _json_object(request: Request) -> dict[str, Any] | Response:
    try:
        payload = json.loads(await request.body() or b"{}")
    except ValueError:
        return _error(400, "body is not valid JSON")
    if not isinstance(payload, dict):
        return _error(400, "body must be an object")
    return payload


async def _load(engine: SimEngine) -> None:
    await asyncio.sleep(engine.options.load_ms / 1000)
    if engine.backend is not None:
        await asyncio.to_thread(engine.backend.allocate)
        if engine.sleeping:  # --start-asleep: load, then sleep, as a standby would
            await asyncio.to_thread(engine.backend.sleep, 1)
    engine.loaded = True
    engine.register_memory()
    log.info("%s: loaded", engine.options.model)
