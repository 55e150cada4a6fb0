"""Continue a stream cut after its headers, on the domain routing commits to next.

The client's stream stays open while the proxy holds it exactly as it holds a new request
(`handler.forward`, fleets/proxy/hold.py), then asks that domain's engine, on its completions
endpoint, for the rest: the prompt's ids and the ids already sent as the prompt (the rules are
in fleets/core/continuation.py). The continuation's chunks are rewritten into the original
stream's format: the same `id`, `created` and `model`, no second role chunk, one
`finish_reason`, usage once over the whole answer, one `[DONE]`.

The text after a seam is rebuilt from ids: the proxy asks an engine's /detokenize for the
answer before the seam while the stream is held (the model's engine on another domain of the
fleet, the standby's: a sleeping vLLM still detokenizes, its tokenizer lives in the API server),
or as it sends the continuation, and at the first chunk that carries text for it with the
continuation's ids:
where the first engine's detokenizer had got to is where the client's text ends, and it sends
the difference; from there on the engine's own deltas are right. (When the ids before the seam
end inside a multi-byte character, vLLM's first continued chunk re-emits earlier text: the
detokenized answer is used for that chunk instead.)
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import json
import logging
import time
import weakref
from typing import Protocol

from fleets.base.conf import haru_settings
from fleets.base.errors import ErrorCode
from fleets.core import continuation as rules
from fleets.metrics import continuations as metrics
from fleets.proxy import handler, upstream
from fleets.proxy.errors import ProxyError
from fleets.proxy.plan import Plan
from fleets.proxy.snapshots import Route
from fleets.proxy.stream_ledger import Ledger


class ClientIO(Protocol):
    """The client side of the stream (fleets/proxy/flow.py's ClientIO): written to only."""

    async def write(self, chunk: bytes) -> None: ...


log = logging.getLogger("haru.proxy")

# Most engines one seam reads the text before it from: the standby's while held, the dead
# active's, the one routing commits to (another domain, or the same one back).
MAX_PREFETCHES = 4
# Most bytes of a /detokenize answer read (the text of an answer within the per-stream bound).
DETOKENIZE_MAX_BYTES = 8 * 1024 * 1024
DONE = b"data: [DONE]\n\n"


class SeamOrder:
    """Send the continuations of one burst stalest first.

    A routing commit wakes every held stream of the fleet in the same moment, and the engine
    they go to answers them about in the order they arrive. A client's stall is the wait
    already open at the cut (up to one token interval, different for each stream) plus its
    place in that queue: sending the streams whose clients have waited longest first evens
    the sums, and for an engine that serves in arrival order makes the longest stall as short
    as any order can (the earliest-due-date rule). Those that are ready together (one turn of
    the event loop) are released together, sorted by when each client's last chunk arrived;
    one alone passes after a single turn."""

    def __init__(self) -> None:
        self._waiting: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._release_at: asyncio.Handle | None = None

    async def turn(self, last_at: float) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._waiting, (last_at, next(self._order), ready))
        if self._release_at is None:
            self._release_at = loop.call_soon(self._release)
        await ready

    def _release(self) -> None:
        self._release_at = None
        while self._waiting:
            ready = heapq.heappop(self._waiting)[2]
            if not ready.done():  # (cancelled: its client left while it waited)
                ready.set_result(None)


# One per event loop (a server process runs one; tests run several in turn).
_SEAM_ORDERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SeamOrder] = (
    weakref.WeakKeyDictionary()
)


def seam_order(loop: asyncio.AbstractEventLoop) -> SeamOrder:
    order = _SEAM_ORDERS.get(loop)
    if order is None:
        order = _SEAM_ORDERS[loop] = SeamOrder()
    return order


class Watchdog:
    """Cut a continuable stream whose upstream went silent past HARU_CHAT_STREAM_STALL_MS."""

    def __init__(self, ledger: Ledger, loop: asyncio.AbstractEventLoop) -> None:
        self._ledger = ledger
        self._loop = loop
        self._response: upstream.Response | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._stall_s = haru_settings().chat_stream_stall_ms / 1000

    def watch(self, response: upstream.Response) -> None:
        self._response = response
        if self._stall_s and self._timer is None:
            # One timer per half bound, not one per chunk: the chunk only stamps the ledger.
            self._timer = self._loop.call_later(self._stall_s / 2, self._check)

    def _check(self) -> None:
        silent = time.monotonic() - self._ledger.last_at
        response = self._response
        if response is not None and silent >= self._stall_s:
            response.fail(f"no byte for {silent:.1f} s (HARU_CHAT_STREAM_STALL_MS)")
            self._timer = None
            return
        self._timer = self._loop.call_later(max(self._stall_s - silent, 0.01), self._check)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


async def resume(
    io: ClientIO,
    plan: Plan,
    ledger: Ledger,
    headers: dict[bytes, bytes],
    exchange: handler.Exchange,
    task: asyncio.Task,
) -> bool:
    """Continue the cut stream to its end; True when the client's stream ended whole.

    False: it could not be continued (the reason is counted); the caller ends the client's
    stream cut, as before this existed.
    """
    fleet = exchange.fleet
    config = haru_settings()
    if ledger.finish is not None and ledger.reason is None:
        # The answer had ended; only its usage chunk or [DONE] was lost with the connection.
        stitch = Stitch(plan, ledger, ledger.answer_ids(), fleet)
        prompt_tokens = len(ledger.prompt())
        await io.write(DONE if ledger.usage_seen else stitch.tail(prompt_tokens))
        return True
    attempts = 0
    while True:
        cut_at = ledger.last_at
        why = ledger.reason
        if why is None and ledger.prompt_ids is None:
            why = "no_ids"  # cut before the first chunk: the prompt's ids never came
        if why is None and attempts >= config.chat_continue_max:
            why = "too_many_cuts"
        if why is not None:
            metrics.failed(fleet, why)
            log.warning("stream for %r cut, not continued: %s", exchange.model, why)
            return False
        attempts += 1
        prompt, answer = ledger.prompt(), ledger.answer_ids()
        stitch = Stitch(plan, ledger, answer, fleet)
        loop = task.get_loop()
        ahead = _read_ahead_route(exchange, headers)
        if ahead is not None:
            # Read while held, not in the burst of a failover: with hundreds of streams
            # continued at once, the engine's queue after the routing commit is the seam's wait.
            stitch.prefetch(ahead, loop, ahead=True)
        request = rules.continuation_request(
            plan.document, plan.endpoint, exchange.model, prompt + answer, len(answer)
        )
        if request is None:  # the answer had reached its limit: only its end was missing
            await io.write(stitch.finish_chunk("", "length", None) + stitch.tail(len(prompt)))
            metrics.continued(fleet, plan.endpoint)
            metrics.stalled(fleet, time.monotonic() - cut_at)
            return True
        try:
            response = await handler.forward(
                headers=headers,
                body=json.dumps(request).encode(),
                endpoint="completions",
                exchange=exchange,
                task=task,
                continuing=True,
                # The text before the seam is asked of the engine the continuation goes to, as
                # it goes: its answer then comes with the first token instead of a round trip
                # after the headers (with 200 streams continued at once, that wait is the
                # engine's queue).
                on_route=functools.partial(stitch.prefetch, loop=loop),
                turn=functools.partial(seam_order(loop).turn, cut_at),
            )
        except ProxyError as err:
            stitch.drop_prefetch()
            metrics.failed(fleet, _reason_of(err))
            log.warning("stream for %r cut, not continued: %s", exchange.model, err.code)
            return False
        route = exchange.route
        assert route is not None  # set by forward() with the response
        try:
            if response.status != 200:
                metrics.failed(fleet, f"upstream_{response.status // 100}xx")
                return False
            stitch.prefetch(route, loop)  # already asked of this route: kept
            ended = await stitch.relay(io, response, route, cut_at, len(prompt), task)
        except _SeamUnknown as exc:
            metrics.failed(fleet, "seam")
            log.warning("stream for %r cut, not continued: %s", exchange.model, exc)
            return False
        finally:
            stitch.drop_prefetch()
            await response.aclose()
        if ended:
            metrics.continued(fleet, plan.endpoint)
            exchange.outcome = "ok"
            return True
        # Cut again: what this continuation forwarded is in the ledger; continue from there.


class _SeamUnknown(Exception):
    """The text the client has does not line up with the detokenized answer."""


class Stitch:
    """One continuation's chunks, rewritten into the original stream's format."""

    def __init__(self, plan: Plan, ledger: Ledger, before: list[int], fleet: str) -> None:
        self.plan = plan
        self.fleet = fleet
        self.ledger = ledger
        self.before = before  # the answer's ids sent before this seam
        self.stops = rules.stops_of(plan.document)
        self.include_stop = bool(plan.document.get("include_stop_str_in_output"))
        self.held = rules.holdback(plan.document)
        self.window = max((len(s) for s in self.stops), default=0)
        self.client = ""  # the text the client has, once worked out at the seam
        self.at = 0  # where it ends in the detokenized answer
        self.generated = len(before)
        head = ledger.template or b""
        at = head.find(b'"choices":[')
        self.head = head[len(b"data: ") : at] if at != -1 else b""
        # The relay's state: before the engine's first text, the seam is still open.
        self._seam = True
        self._cut_at: float | None = None  # the cut, until the first chunk after it
        self._after = ""  # the text sent since the seam
        self._ids: list[int] = []  # every id of this continuation so far
        # The answer's text before the seam, by the /detokenize it was asked of, and the one
        # asked while held, before any route was tried (`ahead`).
        self._before_text: dict[upstream.Target, asyncio.Task[str]] = {}
        self._ahead: upstream.Target | None = None

    def prefetch(
        self, route: Route, loop: asyncio.AbstractEventLoop, *, ahead: bool = False
    ) -> None:
        """Start detokenizing the answer before the seam on `route`'s engine (its own task:
        the header timeout of open_stream cancels the task it runs in). Asked once per engine:
        a held continuation is tried again on the same (dead) route every poll, and a read
        that failed there is read again at the seam if the route ever answers; only a read
        made ahead (while held, on the standby) that failed is asked again when the
        continuation goes there. At most MAX_PREFETCHES engines per seam."""
        target = route.targets["detokenize"]
        if not self.before:
            return
        known = self._before_text.get(target)
        if known is not None:
            if target != self._ahead or not _failed(known):
                return
            self._ahead = None  # once
        elif len(self._before_text) >= MAX_PREFETCHES:
            return
        if ahead:
            self._ahead = target
        self._before_text[target] = loop.create_task(detokenize(route, self.before))

    def drop_prefetch(self) -> None:
        """Cancel the prefetches the relay never needed (cut again before any text)."""
        pending, self._before_text, self._ahead = self._before_text, {}, None
        for read in pending.values():
            if read.done():
                if not read.cancelled():
                    read.exception()  # read, so asyncio never logs it as unretrieved
            else:
                read.cancel()

    # Rendering, in the engine's field order (vLLM: pydantic's model_dump_json, exclude_unset).
    def _chunk(self, text: str, finish: str | None, stop: object, ids: list[int]) -> bytes:
        chat = self.plan.endpoint == "chat"
        content = json.dumps(text, ensure_ascii=False).encode()
        nulls, with_ids = self.ledger.nulls, self.plan.client_ids
        if chat:
            # vLLM leaves an empty delta empty; the simulator always writes its content.
            delta = b'{"content":%b}' % content if text or not nulls else b"{}"
            choice = b'{"index":0,"delta":%b,"logprobs":null,"finish_reason":' % delta
        else:
            choice = b'{"index":0,"text":%b,"logprobs":null,"finish_reason":' % content
        choice += b"null" if finish is None else b'"%b"' % finish.encode()
        if nulls or with_ids:
            if finish is not None or not chat:
                choice += b',"stop_reason":%b' % json.dumps(stop).encode()
            if not chat:
                choice += b',"prompt_token_ids":null'
            listed = json.dumps(ids, separators=(",", ":")).encode()
            choice += b',"token_ids":%b' % (listed if with_ids else b"null")
        return b'data: %b"choices":[%b}]}\n\n' % (self.head, choice)

    def finish_chunk(
        self, text: str, finish: str, stop: object, ids: list[int] | None = None
    ) -> bytes:
        return self._chunk(text, finish, stop, ids or [])

    def tail(self, prompt_tokens: int, shape: dict | None = None) -> bytes:
        """What follows the finish: the usage chunk if the client asked for it, then [DONE].

        `shape` is the continuation's own usage, whose key order the engine's serializer
        chose; without it, vLLM's order."""
        out = b""
        if rules.wants_usage(self.plan.document):
            whole = rules.usage(prompt_tokens, self.generated)
            figures = {key: whole.get(key, value) for key, value in (shape or whole).items()}
            text = json.dumps(figures, separators=(",", ":")).encode()
            out = b'data: %b"choices":[],"usage":%b}\n\n' % (self.head, text)
        return out + DONE

    @property
    def emits_empty(self) -> bool:
        """Whether a chunk without text goes to the client (completions, the simulator's chat,
        a client that asked for ids); vLLM's chat sends none."""
        return self.plan.endpoint == "completions" or not self.ledger.nulls or self.plan.client_ids

    async def relay(
        self,
        io: ClientIO,
        response: upstream.Response,
        route: Route,
        cut_at: float,
        prompt_tokens: int,
        task: asyncio.Task,
    ) -> bool:
        """Forward the continuation; True when the answer ended, False when cut again."""
        watchdog = Watchdog(self.ledger, task.get_loop())
        watchdog.watch(response)
        self._seam, self._cut_at, self._after, self._ids = True, cut_at, "", []
        finished: bytes | None = None  # the finish chunk, sent with the usage that follows
        buf = b""
        try:
            async for raw in _chunks(response):
                self.ledger.last_at = time.monotonic()
                buf += raw
                end = buf.rfind(b"\n\n")
                if end == -1:
                    continue
                events, buf = buf[: end + 2].split(b"\n\n"), buf[end + 2 :]
                for event in events:
                    if not event.startswith(b"data: {"):
                        continue  # [DONE]: ours is sent
                    doc = json.loads(event[6:])
                    choices = doc.get("choices") or []
                    if finished is not None:
                        if not choices and isinstance(doc.get("usage"), dict):
                            await io.write(finished + self.tail(prompt_tokens, doc["usage"]))
                            return True
                        continue
                    if not choices:
                        continue
                    out = await self._step(choices[0], route, task)
                    if out is _ABORTED:
                        return False  # aborted again: a cut
                    if isinstance(out, tuple):  # the answer's end
                        finished = out[0]
                        if not rules.wants_usage(self.plan.document):
                            await io.write(finished + DONE)
                            return True
                    elif out:
                        await io.write(out)
        except upstream.UpstreamClosed as exc:
            log.warning("continuation for %r broke too: %s", route.model, exc)
        finally:
            watchdog.stop()
        if finished is not None:  # ended, but its usage chunk never came: ours
            await io.write(finished + self.tail(prompt_tokens))
            return True
        return False

    async def _step(self, choice: dict, route: Route, task: asyncio.Task):
        """Turn one continuation chunk into the client's bytes: b"" for none, (bytes,) for
        the finish chunk, _ABORTED for an abort."""
        ids = choice.get("token_ids") or []
        text = choice.get("text") or ""
        finish = choice.get("finish_reason")
        stop = choice.get("stop_reason")
        if finish == "abort":
            return _ABORTED
        self._ids += ids
        if self._seam:
            if text or finish is not None:
                text = await self._seam_text(route, finish, stop, task)
                self._seam = False
            else:
                text = ""  # no text yet: neither has the client
        if self.window and len(self._after) < self.window:
            hit = rules.stop_across_seam(
                (self.client + self._after)[-self.window :], text, self.stops, self.include_stop
            )
            if hit is not None:
                text, finish, stop = text[: hit.keep], "stop", hit.stop
        self._after += text
        if (text or finish is not None) and self._cut_at is not None:
            metrics.stalled(self.fleet, time.monotonic() - self._cut_at)  # once, at the seam
            self._cut_at = None
        self.generated += len(ids)
        self.ledger.append(ids)
        if finish is not None:
            return (self.finish_chunk(text, finish, stop, ids),)
        if text or self.emits_empty:
            return self._chunk(text, None, None, ids)
        return b""

    async def _seam_text(
        self, route: Route, finish: str | None, stop: object, task: asyncio.Task
    ) -> str:
        """The text from where the client's ends to where the engine's own text now is.

        Both ends are read off the detokenized answer: before the seam, where the first
        engine's detokenizer had got to (`settled_end`); now, where the continuing one has.
        """
        before = ""
        target = route.targets["detokenize"]
        pending = self._before_text.get(target)
        if pending is not None and not _failed(pending):
            if target == self._ahead and not pending.done():
                before = await self._ahead_or_fresh(pending, route)
            else:
                before = await pending
        elif self.before:  # never asked of this route, or the read failed: once more, now
            before = await detokenize(route, self.before, task)
        self.at = rules.settled_end(before, False, self.held)
        self.client = before[: self.at]
        ids = self.before + self._ids
        if finish == "stop" and (stop is None or isinstance(stop, int)):
            ids = ids[:-1]  # the end-of-sequence (or stop) id: written as no text
        decoded = await detokenize(route, ids, task)
        if not decoded.startswith(self.client):
            raise _SeamUnknown("the answer decodes differently with the continuation's ids")
        end = rules.settled_end(decoded, finish is not None, self.held)
        return decoded[self.at : max(end, self.at)]

    async def _ahead_or_fresh(self, ahead: asyncio.Task[str], route: Route) -> str:
        """The text before the seam when the read made while held (a second or so ago, on
        this same engine) is still unanswered at the seam: raced with a fresh read, so a read
        the engine dropped holds the seam no longer than one that it answers."""
        fresh = asyncio.get_running_loop().create_task(detokenize(route, self.before))
        try:
            done, _ = await asyncio.wait((ahead, fresh), return_when=asyncio.FIRST_COMPLETED)
            for read in (fresh, ahead):
                if read in done and not _failed(read):
                    return read.result()
            return await (ahead if fresh in done else fresh)  # the first failed: the other
        finally:
            if not fresh.done():
                fresh.cancel()
            elif not fresh.cancelled():
                fresh.exception()  # read, so asyncio never logs it as unretrieved


_ABORTED = object()


def _read_ahead_route(exchange: handler.Exchange, headers: dict[bytes, bytes]) -> Route | None:
    """Where the text before a seam can be read while the stream is held: the model's binding
    on another domain of the fleet (the standby, which a failover promotes). None when routing
    has already moved (a planned promotion's switch comes before the old active sleeps and cuts
    the stream: the continuation goes at once, and reads there as it goes), for a split's
    candidate arm, or with no snapshot held."""
    route = exchange.route
    if route is None or route.domain_id:
        return None
    snapshot = handler.last_snapshot(headers)
    if snapshot is None:
        return None
    live = snapshot.routes.get(route.model)
    if live is not None and live.targets["detokenize"] != route.targets["detokenize"]:
        return None
    return snapshot.spares.get(route.model)


def _failed(task: asyncio.Task[str]) -> bool:
    return task.done() and (task.cancelled() or task.exception() is not None)


async def _chunks(response: upstream.Response):
    first = response.buffered()
    if first:
        yield first
    # Even when complete: what arrived while the first chunk was being handled waits there.
    async for chunk in response.aiter_raw():
        yield chunk


async def detokenize(route: Route, ids: list[int], task: asyncio.Task | None = None) -> str:
    """The text of `ids`, from the engine of `route` (its /detokenize); `task` is the running
    task, if the caller has it."""
    target = route.targets["detokenize"]
    body = json.dumps({"model": route.model, "tokens": ids}).encode()
    head = upstream.request_head(target, {}, len(body))
    timeout_ms = haru_settings().chat_header_timeout_ms
    try:
        response = await upstream.open_stream(
            target, head, body, timeout_ms=timeout_ms, model=route.model, task=task
        )
    except upstream.NotStarted as exc:
        raise _SeamUnknown(f"/detokenize refused the connection ({exc})") from None
    except ProxyError as err:
        raise _SeamUnknown(f"/detokenize failed: {err.code}") from None
    try:
        data = response.buffered()
        async with asyncio.timeout(timeout_ms / 1000):
            async for chunk in response.aiter_raw():
                data += chunk
                if len(data) > DETOKENIZE_MAX_BYTES:
                    raise _SeamUnknown("/detokenize answered too much")
        if response.status != 200:
            raise _SeamUnknown(f"/detokenize answered {response.status}")
        text = json.loads(data).get("prompt")
    except (upstream.UpstreamClosed, TimeoutError, ValueError, AttributeError) as exc:
        raise _SeamUnknown(f"/detokenize failed ({type(exc).__name__})") from None
    finally:
        await response.aclose()
    if not isinstance(text, str):
        raise _SeamUnknown("/detokenize answered no text")
    return text


def _reason_of(err: ProxyError) -> str:
    if isinstance(err, handler.CannotContinue):
        return "engine"
    return _REASONS.get(err.code, "no_domain")


# How a held continuation ended, as the failure's reason (a metric label).
_REASONS: dict[str, str] = {
    ErrorCode.MODEL_UNAVAILABLE: "hold_expired",  # held HARU_CHAT_HOLD_MS, no domain took it
    ErrorCode.HOLD_CAPACITY_EXCEEDED: "hold_capacity",
    ErrorCode.SERVER_DRAINING: "draining",
}
