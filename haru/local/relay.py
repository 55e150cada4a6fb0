"""A TCP relay in front of one local port that a test can cut, slow down and heal.

Put in front of a supervisor (its `supervisorUrl` names the relay), it plays the network between
the control plane and that host: `cut()` is a partition (connections are accepted or kept open,
and nothing goes through either way, so the caller's deadline ends each call, not a refusal),
`slow(delay_s)` is a supervisor that answers later than it should (every chunk of its answers
waits `delay_s`), and `heal()` lets everything through again (connections held while it was cut
are closed, as a healed partition's stale connections are). The model servers, which the proxy
reaches directly, are not behind it: they keep serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from common.ports import free_port, port_free

from .processes import wait_for

PASS, CUT, SLOW = "pass", "cut", "slow"


class CutRelay:
    """Relay 127.0.0.1:`port` to 127.0.0.1:`target_port`, cut or slowed on demand."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.mode = PASS
        self.delay_s = 0.0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="cut-relay", daemon=True)
        self._held: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> CutRelay:
        self._thread.start()
        wait_for(lambda: not port_free(self.port), 10, "the relay listening")
        return self

    def cut(self) -> None:
        self.mode = CUT

    def slow(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.mode = SLOW

    def heal(self) -> None:
        self.mode = PASS
        self._loop.call_soon_threadsafe(self._close_held)

    def stop(self) -> None:
        """Close every connection and stop the loop (its thread ends)."""
        done = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        with contextlib.suppress(Exception):
            done.result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _shutdown(self) -> None:
        self._close_held()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- the loop ----------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", self.port))
        with contextlib.suppress(Exception):
            self._loop.run_forever()

    def _close_held(self) -> None:
        for writer in self._held:
            writer.close()
        self._held.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Cancelled only by stop(): the connection just ends, it is not an error.
        with contextlib.suppress(asyncio.CancelledError):
            await self._relay(reader, writer)
        writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == CUT:
            # Accepted (the kernel would have, for a partition past the first hop) and silent.
            self._held.add(writer)
            with contextlib.suppress(Exception):
                while await reader.read(65536):
                    pass
            self._held.discard(writer)
            writer.close()
            return
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pump(reader, up_w, answer=False), self._pump(up_r, writer))

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, answer: bool = True
    ) -> None:
        with contextlib.suppress(Exception):
            while data := await src.read(65536):
                if self.mode == CUT:
                    continue  # lost in the partition
                if answer and self.mode == SLOW:
                    await asyncio.sleep(self.delay_s)
                dst.write(data)
                await dst.drain()
        with contextlib.suppress(Exception):
            dst.close()
