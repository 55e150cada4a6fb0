"""Synthetic probes: one real chat completion per model, proving it answers."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from supervisor.clock import Clock
from supervisor.engines.control import base_url, describe_http_error, snippet


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
) -> dict[str, Any]:
    """Send one chat completion; pass only on a non-empty `choices[0].message.content`.

    A 200 with an empty reply fails on purpose: a server that answers without generating has
    not proven it can serve.
    """
    started = clock.monotonic()
    error: str | None = None
    try:
        # httpx timeouts bound each socket operation; wait_for bounds the whole exchange, so a
        # server trickling bytes cannot stretch a probe past the caller's budget.
        response = await asyncio.wait_for(
            http.post(
                f"{base_url(port)}/v1/chat/completions",
                json={
                    "model": name,
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens,
                    "stream": False,
                },
                headers=headers,
                timeout=timeout_s,
            ),
            timeout_s,
        )
    except (TimeoutError, httpx.TimeoutException):
        error = f"timed out after {int(timeout_s * 1000)}ms"
    except httpx.HTTPError as exc:
        error = describe_http_error(exc)
    else:
        error = _judge(response)
    return {
        "model": name,
        "ok": error is None,
        "latencyMs": int((clock.monotonic() - started) * 1000),
        "error": error,
    }


def _judge(response: httpx.Response) -> str | None:
    if response.status_code != 200:
        return f"HTTP {response.status_code}: {snippet(response)}"
    try:
        content = response.json()["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return "reply has no choices[0].message.content"
    if not isinstance(content, str) or not content:
        return "reply content is empty"
    return None
