"""Synthetic probes: one real chat completion per model (and per LoRA adapter), proving it
answers and, for a golden probe, what it answers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from supervisor.clock import Clock
from supervisor.engines.control import base_url, describe_http_error, snippet

# What a golden probe's result carries of the answer: enough to compare and to show an
# operator expected against got, too little to flood a response, an event or a log.
MAX_ANSWER_CHARS = 1024
# The engine's version is a cheap read; a server slow to give it is not worth waiting for.
VERSION_TIMEOUT_S = 2.0


async def probe_model(
    http: httpx.AsyncClient,
    *,
    name: str,
    port: int,
    prompt: str,
    max_tokens: int,
    timeout_s: float,
    clock: Clock,
    headers: dict[str, str] | None = None,
    adapter: str | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    """Send one chat completion; pass only on a non-empty `choices[0].message.content`.

    A 200 with an empty reply fails on purpose: a server that answers without generating has
    not proven it can serve. `adapter` names a LoRA adapter the server serves: vLLM selects it
    by the request's `model`. With a `seed` the probe is golden: greedy (temperature 0) and
    seeded, so a healthy engine gives the same answer every time, and the answer comes back.
    """
    started = clock.monotonic()
    error: str | None = None
    answer: str | None = None
    body: dict[str, Any] = {
        "model": adapter or name,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": False,
    }
    if seed is not None:
        body.update(temperature=0, seed=seed)
    # ASCII JSON, every non-ASCII character escaped: a prompt may hold a lone surrogate (JSON
    # text may escape one, and the original control plane's JSON.stringify does), which has no
    # UTF-8 form, so httpx's UTF-8 JSON raised and the probe answered 500. Escaped, the engine
    # gets the prompt exactly as the caller wrote it, and judges it itself.
    try:
        # httpx timeouts bound each socket operation; wait_for bounds the whole exchange, so a
        # server trickling bytes cannot stretch a probe past the caller's budget.
        response = await asyncio.wait_for(
            http.post(
                f"{base_url(port)}/v1/chat/completions",
                content=json.dumps(body),
                headers={**(headers or {}), "Content-Type": "application/json"},
                timeout=timeout_s,
            ),
            timeout_s,
        )
    except (TimeoutError, httpx.TimeoutException):
        error = f"timed out after {int(timeout_s * 1000)}ms"
    except httpx.HTTPError as exc:
        error = describe_http_error(exc)
    else:
        error, answer = _judge(response)
    result: dict[str, Any] = {
        "model": name,
        "ok": error is None,
        "latencyMs": int((clock.monotonic() - started) * 1000),
        "error": error,
    }
    if adapter is not None:
        result["adapter"] = adapter
    if seed is not None and answer is not None:
        result["answer"] = answer[:MAX_ANSWER_CHARS]
    return result


async def engine_version(
    http: httpx.AsyncClient,
    *,
    port: int,
    headers: dict[str, str] | None = None,
    timeout_s: float = VERSION_TIMEOUT_S,
) -> str | None:
    """The engine's version (vLLM's `GET /version`), or None when it does not say.

    A golden answer is only comparable within one engine version, so the control plane keys
    its fingerprints by it; not knowing it is not a probe failure.
    """
    budget = min(VERSION_TIMEOUT_S, timeout_s)
    try:
        response = await asyncio.wait_for(
            http.get(f"{base_url(port)}/version", headers=headers, timeout=budget), budget
        )
        version = response.json().get("version") if response.status_code == 200 else None
    except (TimeoutError, httpx.HTTPError, ValueError, AttributeError):
        return None
    return version[:64] if isinstance(version, str) and version else None


def _judge(response: httpx.Response) -> tuple[str | None, str | None]:
    """Return (error, answer): an error for a reply that proves nothing, else the text."""
    if response.status_code != 200:
        return f"HTTP {response.status_code}: {snippet(response)}", None
    try:
        content = response.json()["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return "reply has no choices[0].message.content", None
    if not isinstance(content, str) or not content:
        return "reply content is empty", None
    return None, content
