"""Haru's ASGI app with the chat proxy's upstream HTTP client swapped: `bench/proxy.py --client`.

The proxy sends every request through `fleets.proxy.upstream.open_stream`, which returns a
response with `status`, lowercase `headers`, `aiter_raw()` and `aclose()`. This module (not
shipped) replaces that one function with an httpx or an aiohttp implementation, chosen by
HARU_BENCH_CLIENT, so the hand-written client's advantage can be re-measured on any machine
with the same load, upstreams and code around it:

    uvicorn bench.upstream_clients:application        (HARU_BENCH_CLIENT=httpx|aiohttp|haru)

Each client is configured the way the proxy needs it: one pool per process, no connection
limit, keep-alive, no cookies, no proxies from the environment, bytes passed through undecoded,
the header timeout as the only bound.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import httpx

from fleets.proxy import errors, upstream
from haru.asgi import application  # noqa: F401 - served by uvicorn; also sets Django up

CLIENT = os.environ.get("HARU_BENCH_CLIENT", "haru")
# Set by the client from the request line and headers the proxy built.
_SKIP = {b"host", b"content-length"}


def _split_head(target: upstream.Target, head: bytes) -> tuple[str, list[tuple[str, str]]]:
    """Turn the request head the proxy built back into a URL and header list."""
    lines = head.split(b"\r\n")[1:]
    headers = []
    for line in lines:
        name, sep, value = line.partition(b": ")
        if sep and name not in _SKIP:
            headers.append((name.decode("latin-1"), value.decode("latin-1")))
    url = f"{target.scheme}://{target.host}:{target.port}{target.path.decode()}"
    return url, headers


class _Adapted:
    """A library response shaped like `fleets.proxy.upstream.Response`."""

    def __init__(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        chunks: Callable[[], AsyncIterator[bytes]],
        close: Callable[[], Awaitable[None]],
    ) -> None:
        self.status = status
        self.headers = headers
        self._chunks = chunks
        self._close = close
        # The libraries stream the body only through their iterators: nothing is taken early.
        self.complete = False

    def buffered(self) -> bytes:
        return b""

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._chunks():
                if chunk:
                    yield chunk
        except (httpx.HTTPError, aiohttp.ClientError) as exc:
            raise upstream.UpstreamClosed(str(exc)) from exc

    async def aclose(self) -> None:
        await self._close()


_httpx: httpx.AsyncClient | None = None
_aiohttp: aiohttp.ClientSession | None = None


async def _send_httpx(url: str, headers: list[tuple[str, str]], body: bytes) -> _Adapted:
    global _httpx
    if _httpx is None:
        _httpx = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
            timeout=None,
            trust_env=False,
            follow_redirects=False,
        )
    request = _httpx.build_request("POST", url, headers=headers, content=body)
    response = await _httpx.send(request, stream=True)
    raw = [(k.lower(), v) for k, v in response.headers.raw]
    return _Adapted(response.status_code, raw, response.aiter_raw, response.aclose)


async def _send_aiohttp(url: str, headers: list[tuple[str, str]], body: bytes) -> _Adapted:
    global _aiohttp
    if _aiohttp is None:
        _aiohttp = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
        )
    response = await _aiohttp.post(url, data=body, headers=headers)
    raw = [(k.lower(), v) for k, v in response.raw_headers]

    async def close() -> None:
        response.release()

    return _Adapted(response.status, raw, response.content.iter_any, close)


_SENDERS = {"httpx": _send_httpx, "aiohttp": _send_aiohttp}


async def clients_close() -> None:
    """Close the pools (a test's event loop ends before the process does)."""
    global _httpx, _aiohttp
    if _httpx is not None:
        await _httpx.aclose()
    if _aiohttp is not None:
        await _aiohttp.close()
    _httpx = _aiohttp = None


async def open_stream(
    target: upstream.Target,
    head: bytes,
    body: bytes,
    *,
    timeout_ms: int,
    model: str,
    task: asyncio.Task | None = None,  # the proxy's signature; asyncio.timeout finds the task
) -> Any:
    """The proxy's `open_stream`, through the chosen library, with the same error answers."""
    url, headers = _split_head(target, head)
    try:
        async with asyncio.timeout(timeout_ms / 1000):
            return await _SENDERS[CLIENT](url, headers, body)
    except TimeoutError:
        raise errors.upstream_timeout(
            f"model server for {model!r} sent no response headers within {timeout_ms} ms"
        ) from None
    except (OSError, httpx.HTTPError, aiohttp.ClientError) as exc:
        raise errors.upstream_unreachable(
            f"model server for {model!r} is unreachable ({type(exc).__name__})"
        ) from None


if CLIENT != "haru":
    if CLIENT not in _SENDERS:
        raise SystemExit(f"HARU_BENCH_CLIENT must be haru, httpx or aiohttp, not {CLIENT!r}")
    upstream.open_stream = open_stream  # type: ignore[assignment]
