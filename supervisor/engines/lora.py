"""Loading LoRA adapters into a running model server, and reading which ones it serves.

vLLM (0.32, `vllm/entrypoints/openai/models/serving.py`), with `--enable-lora` and
VLLM_ALLOW_RUNTIME_LORA_UPDATING=True: `POST /v1/load_lora_adapter {lora_name, lora_path}`
answers 200 with text; a name already loaded is a 400 "has already been loaded" (read here as
done: an engine name, NAME@vN, is never reused for other weights). `POST /v1/unload_lora_adapter
{lora_name}` answers 200, or 404 "cannot be found" (read as done). `GET /v1/models` lists each
loaded adapter as a card whose `parent` is the base model: that is the truth reported.
The simulated engine speaks the same endpoints. Engines without runtime LoRA have no control.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import httpx

from supervisor.engines.control import ControlError, base_url, describe_http_error, snippet

# Loading reads the weights from disk and moves them to the GPU: small adapters take well under
# a second, but a busy server answers later.
LOAD_TIMEOUT_S = 60.0
MODELS_TIMEOUT_S = 5.0
# Adapter cards read from /v1/models at most (the engine's maxLoras is far below).
MAX_LISTED = 64
_ALREADY = "has already been loaded"
_NOT_FOUND = "cannot be found"


class VllmLora:
    """vLLM's runtime LoRA endpoints on 127.0.0.1:port."""

    async def _post(
        self, http: httpx.AsyncClient, url: str, body: dict[str, str], headers: Mapping[str, str]
    ) -> httpx.Response:
        try:
            return await asyncio.wait_for(
                http.post(url, json=body, headers=dict(headers), timeout=LOAD_TIMEOUT_S),
                LOAD_TIMEOUT_S,
            )
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise ControlError(f"{url.rsplit('/', 1)[-1]} timed out") from exc
        except httpx.HTTPError as exc:
            raise ControlError(
                f"{url.rsplit('/', 1)[-1]} failed: {describe_http_error(exc)}"
            ) from exc

    async def load(
        self,
        http: httpx.AsyncClient,
        port: int,
        name: str,
        path: str,
        headers: Mapping[str, str],
    ) -> None:
        url = f"{base_url(port)}/v1/load_lora_adapter"
        response = await self._post(http, url, {"lora_name": name, "lora_path": path}, headers)
        if response.status_code == 200:
            return
        if response.status_code == 400 and _ALREADY in response.text:
            return  # idempotent: the name is this adapter's for good
        raise ControlError(
            f"load_lora_adapter returned HTTP {response.status_code}: {snippet(response)}"
        )

    async def unload(
        self, http: httpx.AsyncClient, port: int, name: str, headers: Mapping[str, str]
    ) -> None:
        url = f"{base_url(port)}/v1/unload_lora_adapter"
        response = await self._post(http, url, {"lora_name": name}, headers)
        if response.status_code == 200:
            return
        if response.status_code == 404 and _NOT_FOUND in response.text:
            return  # not loaded: what was asked
        raise ControlError(
            f"unload_lora_adapter returned HTTP {response.status_code}: {snippet(response)}"
        )

    async def loaded(
        self, http: httpx.AsyncClient, port: int, headers: Mapping[str, str]
    ) -> list[str]:
        """The adapter names the engine lists; raise ControlError when it cannot say."""
        try:
            response = await asyncio.wait_for(
                http.get(
                    f"{base_url(port)}/v1/models", headers=dict(headers), timeout=MODELS_TIMEOUT_S
                ),
                MODELS_TIMEOUT_S,
            )
        except (TimeoutError, httpx.HTTPError) as exc:
            raise ControlError("/v1/models did not answer") from exc
        if response.status_code != 200:
            raise ControlError(f"/v1/models returned HTTP {response.status_code}")
        try:
            cards = response.json().get("data")
        except (ValueError, AttributeError):
            raise ControlError("/v1/models answered no model list") from None
        if not isinstance(cards, list):
            raise ControlError("/v1/models answered no model list")
        names = [
            c["id"]
            for c in cards[: MAX_LISTED + 1]
            if isinstance(c, dict) and isinstance(c.get("id"), str) and c.get("parent")
        ]
        return sorted(names)
