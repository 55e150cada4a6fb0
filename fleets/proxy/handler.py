"""The proxy's decisions and its one flow, free of any transport.

Who may call, which fleet, which model, where to send it, what to record. The request flow
(`fleets.proxy.flow`, run by the ASGI app and by `manage.py serve`'s direct path) and the
benchmark's Django-view baseline (`bench/django_proxy.py`) all run this, so they answer alike;
they differ only in how bytes come in and go out.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING

from common.wire import bounded_json
from fleets.base.conf import haru_settings
from fleets.base.errors import ErrorCode
from fleets.base.tokens import chat_allowed
from fleets.core.arm_stats import Arm
from fleets.metrics import requests as request_metrics
from fleets.proxy import adapters, arm_stats, errors, hold, split, upstream
from fleets.proxy.snapshots import ROUTES, Route, Snapshot, clip
from fleets.reconciler import datapath

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from fleets.proxy.plan import Plan

ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/models": "models",
}
# GET /v1/models/{model} (the SDKs' models.retrieve); a model name may itself hold "/".
MODEL_PREFIX = "/v1/models/"
STALE_HEADER = (b"x-haru-routing", b"stale")
# Outcomes that are no fault of the arm (a client's own 4xx, a client leaving): the rest of a
# split request's outcomes count as the arm's errors.
ARM_OK = frozenset({"ok", "upstream_4xx", "client_disconnected"})
perf = time.perf_counter


class CannotContinue(errors.ProxyError):
    """The domain routing committed to serves the model on an engine that cannot continue."""

    def __init__(self, message: str) -> None:
        err = errors.upstream_unreachable(message)
        super().__init__(err.status, err.code, message, headers=err.headers)


class Exchange:
    """One request's accounting, recorded in metrics once its response is done."""

    __slots__ = ("arrived", "fleet", "model", "outcome", "overhead", "ttfb", "stale", "route",
                 "arm", "rollout", "avoid_candidate", "gaps", "last_chunk", "adapter")  # fmt: skip

    def __init__(self) -> None:
        self.arrived = perf()
        self.fleet = ""
        self.model = ""
        self.outcome = "ok"
        self.overhead: float | None = None
        self.ttfb: float | None = None
        self.stale = False
        self.route: Route | None = None  # the route the request was last sent on
        # A split model's request (fleets/proxy/split.py): the arm it was last sent to (None:
        # not a split model), its rollout, whether the candidate failed it already (it then
        # goes to the stable arm), and the gaps between its stream's chunks.
        self.arm: str | None = None
        self.rollout = ""
        self.avoid_candidate = False
        self.gaps: list[float] | None = None
        self.last_chunk = 0.0
        # A request for an adapter's name (fleets/proxy/adapters.py): its version; None else.
        self.adapter: adapters.AdapterPick | None = None

    def first_byte(self) -> None:
        if self.ttfb is None:
            self.ttfb = perf() - self.arrived
            if self.arm is not None:  # a split model's stream: its gaps are counted from here
                self.gaps, self.last_chunk = [], perf()

    def chunk(self) -> None:
        """A chunk of the body went to the client (`first_byte`, and a split model's gap)."""
        if self.gaps is not None:
            if len(self.gaps) < arm_stats.MAX_GAPS:
                now = perf()
                self.gaps.append(now - self.last_chunk)
                self.last_chunk = now
        elif self.ttfb is None:
            self.first_byte()

    def record(self) -> None:
        request_metrics.record(
            fleet=self.fleet,
            model=self.model,
            outcome=self.outcome,
            overhead_s=self.overhead,
            ttfb_s=self.ttfb,
            stale=self.stale,
        )
        if self.adapter is not None and self.ttfb is not None and self.outcome == "ok":
            # Its version served a user token: the freshness figure's end, stored once per
            # version by the background writer (never on this path).
            pick = self.adapter
            arm_stats.RECORDER.first_served((pick.fleet_id, pick.name, pick.version))
        if self.arm is not None:
            ok = self.outcome in ARM_OK
            arm_stats.RECORDER.record(
                fleet=self.fleet,
                rollout_id=self.rollout,
                model=self.model,
                arm=self.arm,
                ok=ok,
                ttft_s=self.ttfb if ok else None,
                gaps_s=(self.gaps or ()) if ok else (),
            )

    def candidate_failed(self) -> None:
        """The candidate failed this request before anything was sent to the client: count
        the error on the candidate arm; the request goes to the stable arm once."""
        arm_stats.RECORDER.record(
            fleet=self.fleet, rollout_id=self.rollout, model=self.model, arm=Arm.CANDIDATE, ok=False
        )
        self.avoid_candidate = True
        self.arm = Arm.STABLE


def text(value: bytes | None) -> str | None:
    return value.decode("latin-1") if value is not None else None


def authorize(authorization: str | None) -> None:
    """Refuse the request unless it carries the operator token or a chat token (when any token
    is configured)."""
    if not chat_allowed(authorization):
        raise errors.unauthorized()


def check_content_length(value: str | None, limit: int) -> None:
    """Refuse a declared body over `limit` before reading any of it."""
    if value is None:
        return  # chunked: counted while it streams in
    try:
        declared = int(value)
    except ValueError:
        raise errors.invalid_request("Content-Length is not an integer") from None
    if declared < 0:
        raise errors.invalid_request("Content-Length is negative")
    if declared > limit:
        raise errors.payload_too_large(limit)


def fleet_ref(header: str | None) -> str:
    """Return the fleet the request names (X-Haru-Fleet), else HARU_DEFAULT_FLEET."""
    ref = (header or "").strip() or haru_settings().default_fleet
    if not ref:
        raise errors.fleet_not_found(
            "no fleet selected: send the X-Haru-Fleet header or set HARU_DEFAULT_FLEET"
        )
    return ref


def last_snapshot(headers: dict[bytes, bytes]) -> Snapshot | None:
    """The last routing snapshot this process loaded for the request's fleet, however old
    (None when none, or no fleet is named): read for what no pointer move changes."""
    try:
        return ROUTES.last(fleet_ref(text(headers.get(b"x-haru-fleet"))))
    except errors.ProxyError:
        return None


def requested_model(body: bytes) -> str:
    """Read `model` from the JSON body; the body itself is forwarded untouched."""
    return request_document(body)["model"]


def request_document(body: bytes) -> dict:
    """Parse the JSON body and check its `model`; refuse what cannot be forwarded."""
    try:
        document = bounded_json.loads(body, max_depth=haru_settings().json_max_depth)
    except ValueError as exc:
        # Bad JSON, too deep (never a RecursionError's 500) or a repeated key.
        raise errors.invalid_request(f"request body is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise errors.invalid_request("request body must be a JSON object")
    model = document.get("model")
    if not isinstance(model, str) or not model:
        raise errors.invalid_request("`model` is required and must be a non-empty string")
    return document


def pick(snapshot: Snapshot, model: str) -> Route:
    """Return the route of `model` on the fleet's active domain (exact routing-key match)."""
    route = snapshot.routes.get(model)
    if route is not None:
        return route
    if snapshot.active_domain_id is None:
        raise errors.no_active_domain(f"fleet {snapshot.fleet_slug} has no active domain")
    if model in snapshot.unavailable:
        raise errors.model_unavailable(
            f"model {model!r} is bound on domain {snapshot.active_domain_slug} but cannot take "
            f"traffic now ({snapshot.unavailable[model]}); retry"
        )
    available = ", ".join(snapshot.available) or "none"
    raise errors.model_not_found(
        f"model {clip(model)!r} is not served by fleet {snapshot.fleet_slug}; "
        f"available: {available}"
    )


async def forward(
    *,
    headers: dict[bytes, bytes],
    body: bytes,
    endpoint: str,
    exchange: Exchange,
    task: asyncio.Task | None = None,
    plan: Plan | None = None,
    continuing: bool = False,
    on_route: Callable[[Route], None] | None = None,
    turn: Callable[[], Awaitable[None]] | None = None,
) -> upstream.Response:
    """Route the request and send it upstream; return the response once its headers are in.

    `headers` are the request's, lowercase names. Raises ProxyError for every refusal. When the
    active cannot take the request and provably did not start it, the request is held
    (fleets/proxy/hold.py) and sent again once routing changes or the model server is back.
    `task` is the request's task if the caller has it: on Python 3.11 every lookup of the
    running loop or task is a getpid() system call, and this path would otherwise make five.
    `plan` (fleets/proxy/plan.py) asks for token ids on a route whose engine can
    continue, and sends a non-streamed request cut before its headers again; `continuing`
    marks a stream's continuation, which only an engine that can continue may take.
    `on_route` is told each route the request is about to be sent on (a continuation starts
    reading the text before its seam there while the engine computes its first token), and
    `turn`, when given, is awaited before each (a continuation's place in a burst).
    """
    if task is None:
        task = asyncio.current_task()
        assert task is not None
    loop = task.get_loop()
    model = plan.document["model"] if plan is not None else requested_model(body)
    ref = fleet_ref(text(headers.get(b"x-haru-fleet")))
    held: hold.Hold | None = None
    try:
        while True:
            # The healthy path needs no read, so no await (a Resolved, a 2-tuple, is truthy).
            resolved = ROUTES.cached(ref, loop) or await ROUTES.resolve(ref, loop)
            snapshot = resolved.snapshot
            exchange.fleet, exchange.stale = snapshot.fleet_slug, resolved.stale
            try:
                # A fleet with no split pays one falsy check here.
                splitting = snapshot.splits.get(model) if snapshot.splits else None
                renamed: bytes | None = None  # the body naming an adapter's version
                if splitting is None:
                    exchange.arm = None  # (a split cleared while this request was held)
                    route = snapshot.routes.get(model)
                    if route is None:
                        # Only a name no binding serves is looked up as an adapter's.
                        adapter = snapshot.adapters.get(model) if snapshot.adapters else None
                        if adapter is None:
                            route = pick(snapshot, model)
                        else:
                            route, renamed = adapters.route(
                                snapshot, model, adapter, headers, exchange, plan, body
                            )
                else:
                    stable = snapshot.routes.get(model)
                    exchange.rollout = splitting.split.rollout_id
                    exchange.arm, chosen = split.choose(
                        splitting, stable, headers, avoid_candidate=exchange.avoid_candidate
                    )
                    route = chosen or pick(snapshot, model)
            except errors.ProxyError as err:
                if err.code != ErrorCode.MODEL_UNAVAILABLE:
                    raise
                why = err
            else:
                exchange.model, exchange.route = route.model, route
                if renamed is not None:
                    exchange.model = model  # an adapter's requests are labelled by its name
                if continuing and not route.continues:
                    # Never answered to a client: the continuation counts it (reason "engine").
                    raise CannotContinue(f"{route.model!r}'s engine cannot continue a stream")
                if turn is not None:
                    await turn()
                if on_route is not None:
                    on_route(route)
                # (An adapter's candidate already failed this request when it is sent there
                # again: only its version was probed. It is not retried twice.)
                candidate = exchange.arm == Arm.CANDIDATE and not exchange.avoid_candidate
                try:
                    sent = await _attempt(
                        route,
                        snapshot,
                        headers,
                        plan.body_for(route, renamed) if plan is not None else renamed or body,
                        endpoint,
                        exchange,
                        task,
                        plan if plan is not None and plan.reruns_on(route) else None,
                        retry_lost=continuing,
                    )
                except errors.ProxyError as err:
                    if not candidate:
                        raise
                    sent = err  # a timeout, a TLS fault: the stable arm is asked instead
                if candidate and await _candidate_failed(sent):
                    # Nothing of it reached the client: straight to the stable arm, once.
                    exchange.candidate_failed()
                    continue
                if not isinstance(sent, errors.ProxyError):
                    if held is not None:
                        held.close("forwarded")
                    return sent
                why = sent
            if held is None:
                held = hold.HOLDS.admit(why, len(body))
            await held.wait(snapshot.fleet_id, why, snapshot.revision)
            exchange.avoid_candidate = False  # routing changed: either arm may serve again
    except asyncio.CancelledError:
        if held is not None:
            held.close("disconnected")  # the watcher cancels this task when the client leaves
        raise
    except BaseException:
        if held is not None:
            held.close("failed")  # a refusal met while held (expired/drained closed already)
        raise


async def _candidate_failed(sent: upstream.Response | errors.ProxyError) -> bool:
    """Whether the candidate failed a request before any byte of it reached the client (not
    started, lost, 5xx): then the response, if any, is closed."""
    if isinstance(sent, errors.ProxyError):
        return True
    if sent.status < 500:
        return False
    await sent.aclose()
    return True


async def _attempt(
    route: Route,
    snapshot: Snapshot,
    headers: dict[bytes, bytes],
    body: bytes,
    endpoint: str,
    exchange: Exchange,
    task: asyncio.Task,
    rerun: Plan | None = None,
    *,
    retry_lost: bool = False,
) -> upstream.Response | errors.ProxyError:
    """Send once; return the response, or why the upstream provably did not start it (or, for
    a non-streamed request to an engine that can continue, `rerun`, or a stream's continuation,
    `retry_lost`, that it was lost before anything of it was sent to the client: it is sent
    again, held like the rest)."""
    target = route.targets[endpoint]
    head = upstream.request_head(target, headers, len(body))
    if exchange.overhead is None:
        exchange.overhead = perf() - exchange.arrived
    try:
        response = await upstream.open_stream(
            target,
            head,
            body,
            timeout_ms=haru_settings().chat_header_timeout_ms,
            model=route.model,
            task=task,
        )
    except upstream.NotStarted as exc:
        # Seen by the data path first: the reconciler confirms it with a targeted heartbeat.
        datapath.report_unreachable(
            snapshot.fleet_id,
            route.domain_id or snapshot.active_domain_id or "",
            route.model,
            time.time(),
        )
        return errors.upstream_unreachable(
            f"model server for {route.model!r} refused the connection ({exc})"
        )
    except errors.ProxyError as err:
        if (rerun is None and not retry_lost) or not err.lost:
            raise  # a TLS or DNS fault too: answered at once, never held
        # Accepted, then lost with its engine before any byte came back: the client has seen
        # nothing of it, so it is asked again, of whichever domain routing commits to. (A
        # continuation meets this on the dead engine's pooled connection: the request went out
        # on it before the pool could know the engine was gone.)
        if rerun is not None:
            rerun.reruns += 1
        datapath.report_unreachable(
            snapshot.fleet_id,
            route.domain_id or snapshot.active_domain_id or "",
            route.model,
            time.time(),
        )
        return err
    if response.status == 503:
        # "Service Unavailable" before any body: the server says it did not handle it.
        await response.aclose()
        return errors.model_unavailable(
            f"model server for {route.model!r} answered 503 (unavailable); retry"
        )
    exchange.outcome = "ok" if response.status < 400 else f"upstream_{response.status // 100}xx"
    return response


def response_headers(response: upstream.Response, exchange: Exchange) -> list:
    out = upstream.response_headers(response)
    if exchange.stale:
        out.append(STALE_HEADER)
    return out


def endpoint_of(path: str) -> str | None:
    """Return which proxy endpoint serves `path` ("model" for one model), or None."""
    endpoint = ENDPOINTS.get(path)
    if endpoint is None and path.startswith(MODEL_PREFIX) and len(path) > len(MODEL_PREFIX):
        return "model"
    return endpoint


def _model_object(name: str) -> dict:
    return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "haru"}


async def model_retrieve(*, name: str, headers: dict[bytes, bytes], exchange: Exchange) -> bytes:
    """Render GET /v1/models/{name}: the model if the active domain serves it now.

    The same rules as a chat request naming it: 404 model_not_found (listing what is
    available), 503 model_unavailable while it is bound but not serving, 503 no_active_domain.
    """
    resolved = await ROUTES.resolve(fleet_ref(text(headers.get(b"x-haru-fleet"))))
    snapshot = resolved.snapshot
    exchange.fleet, exchange.stale = snapshot.fleet_slug, resolved.stale
    # Labelled only once known: a client's arbitrary name must not become a metric series.
    exchange.model = pick(snapshot, name).model
    return json.dumps(_model_object(name)).encode()


async def models(*, headers: dict[bytes, bytes], exchange: Exchange) -> bytes:
    """Render GET /v1/models: what the active domain can serve now, in OpenAI's list format."""
    resolved = await ROUTES.resolve(fleet_ref(text(headers.get(b"x-haru-fleet"))))
    snapshot = resolved.snapshot
    exchange.fleet, exchange.stale = snapshot.fleet_slug, resolved.stale
    if snapshot.active_domain_id is None:
        raise errors.no_active_domain(f"fleet {snapshot.fleet_slug} has no active domain")
    return json.dumps(
        {"object": "list", "data": [_model_object(name) for name in snapshot.available]}
    ).encode()
