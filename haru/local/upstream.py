"""A fast upstream: one OpenAI-shaped JSON answer per request, on an event loop of its own
thread. It stands in for a model server where what is measured or tested is the Haru server's
own cost and edges, not an engine's."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
_ANSWER = json.dumps({"choices": [{"index": 0, "message": {"content": "pong"}}]}).encode()


async def read_request(reader: asyncio.StreamReader) -> None:
    """Read one request (head and Content-Length body) off an upstream's connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)


async def answer_pong(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer every request on the connection with the same small chat completion."""
    try:
        while True:
            await read_request(reader)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(_ANSWER), _ANSWER)
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def start_upstream(handler: Handler = answer_pong) -> tuple[int, asyncio.AbstractEventLoop]:
    """Serve `handler` on a loopback port on a daemon thread; return (port, its loop)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    port_box: list[int] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        # Listening on port 0 keeps the port it is given: no probe, no race.
        server = loop.run_until_complete(asyncio.start_server(handler, "127.0.0.1", 0))
        port_box.append(server.sockets[0].getsockname()[1])
        ready.set()
        loop.run_forever()

    threading.Thread(target=run, daemon=True).start()
    if not ready.wait(10):
        raise RuntimeError("the upstream did not start within 10 s")
    return port_box[0], loop
