"""The per-process routing snapshot cache, re-validated against the pointer within a poll bound.

A request reads the fleet's pointer (`route_revision`, `active_domain_id`) with one indexed
query and compares it with the cached snapshot, unless this process read it less than
HARU_CHAT_HOLD_POLL_MS ago and no newer revision was pushed since (`push.FEED`: Postgres NOTIFY,
Redis, or the CAS in this process). A pointer move therefore takes effect at once when pushed,
and within the poll bound when not (0 reads it on every request); the planned promotion puts
the old active to sleep only after a grace longer than that bound. The TTL
(HARU_SNAPSHOT_CACHE_TTL_MS) bounds only how stale non-routing state (domain and slot health,
which adapter copies are probed: their moves bump no revision, docs/adapter-routing.md) may
be. Profiled in bench/proxy.py: the per-request read was the largest single cost of the healthy
path.

Failure rules (docs/design.md, "Failure rules"):
- the pointer read itself fails (store unreachable): serve the last snapshot this process saw
  for that fleet reference, marked stale. Safe: the pointer cannot move while the store is down.
- the store answered but the state is unusable (a moved revision whose snapshot will not load,
  malformed rows): fail closed, and never serve the superseded snapshot again.
- the store says the fleet is gone: forget it under every alias (slug, UUID spellings).
- no snapshot yet (cold cache) and no store: fail closed.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import NamedTuple
from urllib.parse import urlsplit

from fleets.base import clock
from fleets.base.conf import HaruSettings, haru_settings
from fleets.core.adapter_route import (
    AdapterRoute,
    AdapterRouteInvalid,
    adapter_routes_parse,
    concrete_name,
)
from fleets.core.continuation import engine_continues
from fleets.core.read_model import DomainView, ModelView
from fleets.core.route_intent import is_model_routable
from fleets.core.route_split import MAX_SPLITS, Split, SplitInvalid, split_parse
from fleets.core.states import SlotKind
from fleets.core.urls import without_userinfo
from fleets.models import SLUG_REGEX
from fleets.proxy import errors, store
from fleets.proxy.push import FEED
from fleets.proxy.upstream import Target

log = logging.getLogger("haru.proxy")

# A healthy store answers the indexed pointer read in well under a millisecond; past this, a
# hung store must not hold the data path, so the read counts as failed and the proxy fails
# open. (A refused connection fails at once; set `?connect_timeout=2` on a Postgres
# DATABASE_URL so a black-holed one gives the thread back quickly too.)
POINTER_READ_TIMEOUT_S = 1.0
# Fail-open and fail-closed verdicts are logged at most this often per fleet reference.
LOG_EVERY_S = 10.0

_SLUG = re.compile(SLUG_REGEX)
UNUSABLE = "state store answered with unusable state"
# "detokenize" is the proxy's own: a stream's continuation rebuilds its text there; no client
# path leads to it (the proxy's endpoints are chat and completions).
_UPSTREAM_PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "detokenize": "/detokenize",
}


@dataclass(frozen=True)
class Route:
    """Where one model's requests go: targets built once, only from the binding's serving URL."""

    model: str
    targets: dict[str, Target]  # endpoint ("chat", "completions", "detokenize") -> target
    # The binding's engine returns token ids and takes them as a prompt: a stream cut on it
    # can be continued (fleets/core/continuation.py).
    continues: bool = False
    engine: str = ""  # the binding's engine as its profile names it ("" when none does)
    # The domain serving it when that is not the active (a split's candidate arm); "": the
    # active's.
    domain_id: str = ""


@dataclass(frozen=True)
class SplitRoute:
    """A split model's candidate arm as this snapshot saw it (fleets/proxy/split.py routes).

    `candidate` is None when the candidate cannot take traffic now (its server down, its slot
    not serving, its domain not ready, no binding): the stable arm then takes the whole share.
    """

    split: Split
    candidate: Route | None
    why: str = ""  # why the candidate gets nothing, when it does not


@dataclass(frozen=True)
class Snapshot:
    fleet_id: str
    fleet_slug: str
    revision: int
    active_domain_id: str | None
    active_domain_slug: str | None
    active_domain_state: str | None
    routes: dict[str, Route]
    # Bound on the active domain but not routable now (slot not serving, domain not
    # ready/degraded): name -> why.
    unavailable: dict[str, str]
    loaded_at: float = field(compare=False)
    # Weighted splits by model name (empty on a fleet with none: the healthy path's one check),
    # and the stored splits the router ignored as malformed, model -> why.
    splits: dict[str, SplitRoute] = field(default_factory=dict)
    split_faults: dict[str, str] = field(default_factory=dict)
    # Adapter routes by adapter name (empty on a fleet with none: the healthy path never looks:
    # only a name no binding serves is looked up here), the engine names (`name@vN`) whose
    # copy is probed, per domain id, and why the stored routes were refused ("" when not).
    adapters: dict[str, AdapterRoute] = field(default_factory=dict)
    probed: dict[str, frozenset[str]] = field(default_factory=dict)
    adapter_fault: str = ""
    # By model name, the model's binding on another domain of the fleet whose engine can
    # continue (the standby's, asleep or not): where a stream cut on the active reads the text
    # before its seam while it is held. Only /detokenize is ever asked of it from here.
    spares: dict[str, Route] = field(default_factory=dict)

    @property
    def available(self) -> list[str]:
        return sorted(self.routes)


class Resolved(NamedTuple):
    # A named tuple, not a frozen dataclass: one is built per request, at a fifth of the cost.
    snapshot: Snapshot
    stale: bool  # served from cache because the store could not be asked


class Malformed(Exception):
    """Rows the proxy refuses to route on."""


def upstream_targets(serving_url: str) -> dict[str, Target]:
    """Build the only endpoints the proxy ever calls for a binding: its inference endpoints.

    Only the binding's scheme, authority and path prefix come from the state store, and nothing
    comes from the request, so no model name, path or query a client sends can reach a model
    server's /sleep or /wake_up, or the supervisor.
    """
    parts = urlsplit(serving_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        shown = without_userinfo(serving_url)
        raise Malformed(f"serving URL {shown!r} is not an absolute http(s) URL")
    if parts.query or parts.fragment or "?" in serving_url or "#" in serving_url:
        # Shown without them: the message reaches chat clients, and a query may hold a key.
        shown = without_userinfo(serving_url).split("?", 1)[0].split("#", 1)[0]
        raise Malformed(f"serving URL {shown!r} carries a query or fragment (not shown)")
    if parts.username is not None or parts.password is not None:
        raise Malformed(f"serving URL of {parts.hostname} carries credentials")
    prefix = parts.path.rstrip("/")
    if (
        any(seg in (".", "..") for seg in prefix.split("/"))
        or "%" in prefix
        or not all(32 < ord(c) < 127 for c in prefix)
    ):
        raise Malformed(f"serving URL {serving_url!r} has an unusable path")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host_header = parts.netloc.encode("ascii")
    except (ValueError, UnicodeEncodeError):
        raise Malformed(f"serving URL {serving_url!r} has an invalid host or port") from None
    return {
        endpoint: Target(
            scheme=parts.scheme,
            host=parts.hostname,
            port=port,
            host_header=host_header,
            path=(prefix + path).encode(),
        )
        for endpoint, path in _UPSTREAM_PATHS.items()
    }


def _model_view(b: store.BindingRow) -> ModelView:
    """The binding as the routability rule reads it (the active's and a candidate's alike)."""
    return ModelView(
        name=b.name,
        serving_url=b.serving_url,
        slot_id=b.slot_id,
        gpu_index=b.gpu_index,
        slot_state=b.slot_state,
        health=b.health,
    )


def snapshot_build(rows: store.SnapshotRows, loaded_at: float) -> Snapshot:
    """Turn store rows into a snapshot, or raise Malformed."""
    pointer = rows.pointer
    routes: dict[str, Route] = {}
    unavailable: dict[str, str] = {}
    if pointer.active_domain_id is not None:
        slug, state = rows.domain_slug, rows.domain_state
        if rows.domain_fleet_id != pointer.fleet_id or slug is None or state is None:
            raise Malformed("the active domain is missing or belongs to another fleet")
        domain = DomainView(id=pointer.active_domain_id, slug=slug, state=state)
        for b in rows.bindings:
            if b.slot_kind != SlotKind.INFERENCE or b.slot_domain_id != pointer.active_domain_id:
                raise Malformed(f"model {b.name!r} is bound to a slot that cannot serve it")
            targets = upstream_targets(b.serving_url)
            model = _model_view(b)
            if is_model_routable(domain, model):
                routes[b.name] = Route(
                    model=b.name,
                    targets=targets,
                    continues=engine_continues(b.engine),
                    engine=b.engine,
                )
            else:
                unavailable[b.name] = (
                    f"domain {domain.state}, slot {b.slot_state}, server {b.health}"
                )
    splits, faults = splits_build(rows) if rows.splits else ({}, {})
    adapters, probed, adapter_fault = adapters_build(rows) if rows.adapter_routes else ({}, {}, "")
    spares = spares_build(rows.spares, set(routes) | set(unavailable))
    return Snapshot(
        fleet_id=pointer.fleet_id,
        fleet_slug=pointer.slug,
        revision=pointer.revision,
        active_domain_id=pointer.active_domain_id,
        active_domain_slug=rows.domain_slug,
        active_domain_state=rows.domain_state,
        routes=routes,
        unavailable=unavailable,
        loaded_at=loaded_at,
        splits=splits,
        split_faults=faults,
        adapters=adapters,
        probed=probed,
        adapter_fault=adapter_fault,
        spares=spares,
    )


def spares_build(rows: tuple[store.BindingRow, ...], bound: set[str]) -> dict[str, Route]:
    """The first binding on another domain of each model the active binds, whose engine can
    continue. A malformed serving URL there is skipped: the standby's rows never stop the
    active's traffic (the promotion's own probe judges that binding)."""
    spares: dict[str, Route] = {}
    for b in rows:
        if b.name in spares or b.name not in bound or not engine_continues(b.engine):
            continue
        try:
            targets = upstream_targets(b.serving_url)
        except Malformed:
            continue
        spares[b.name] = Route(
            model=b.name,
            targets=targets,
            continues=True,
            engine=b.engine,
            domain_id=b.slot_domain_id,
        )
    return spares


# Adapter-route faults already logged, (fleet id, why): a bad row is logged once per process,
# not on every snapshot load (every TTL). Bounded: a fault text is ours, fleets are few.
_ADAPTER_FAULTS_LOGGED: set[tuple[str, str]] = set()


def adapters_build(
    rows: store.SnapshotRows,
) -> tuple[dict[str, AdapterRoute], dict[str, frozenset[str]], str]:
    """The fleet's adapter routes, the probed engine names per domain, and the fault.

    Fails open for the models: routes the router cannot read (fleets/core/adapter_route.py
    refuses them) route no adapter of this fleet (a request for one is answered 404 as an
    unknown model), and are logged once; the snapshot, so every model's routing, stands.
    """
    try:
        routes = adapter_routes_parse(rows.adapter_routes)
    except AdapterRouteInvalid as exc:
        why = str(exc)
        key = (rows.pointer.fleet_id, why)
        if key not in _ADAPTER_FAULTS_LOGGED:
            if len(_ADAPTER_FAULTS_LOGGED) >= 1024:
                _ADAPTER_FAULTS_LOGGED.clear()
            _ADAPTER_FAULTS_LOGGED.add(key)
            log.warning(
                "fleet %s: adapter routes refused, no adapter is routed: %s",
                rows.pointer.slug,
                why,
            )
        return {}, {}, why
    probed: dict[str, set[str]] = {}
    for domain_id, name, version in rows.probed:
        route = routes.get(name)
        if route is not None and version in route.versions():
            probed.setdefault(domain_id, set()).add(concrete_name(name, version))
    return routes, {d: frozenset(names) for d, names in probed.items()}, ""


def splits_build(rows: store.SnapshotRows) -> tuple[dict[str, SplitRoute], dict[str, str]]:
    """The fleet's splits as the router uses them, and the malformed ones it ignores.

    Fails open, model by model: a split the router cannot read (bad shape, a candidate outside
    the fleet or the active itself, a candidate binding whose URL will not do) is ignored, so
    the stable arm serves all of that model, and noted (a log line per snapshot load, and
    `Snapshot.split_faults`); it never fails the snapshot, so never a 5xx.
    """
    raw = rows.splits
    if not isinstance(raw, dict):
        why = "route splits are not an object"
        log.warning("fleet %s: %s; ignored", rows.pointer.slug, why)
        return {}, {"*": why}
    candidates = {(c.domain_id, c.binding.name): c for c in rows.candidates}
    splits: dict[str, SplitRoute] = {}
    faults: dict[str, str] = {}
    for model, value in list(raw.items())[:MAX_SPLITS]:
        try:
            split = split_parse(value, model=str(model))
            splits[str(model)] = _split_route(
                rows, split, candidates.get((split.candidate_domain_id, str(model)))
            )
        except (SplitInvalid, Malformed) as exc:
            faults[str(model)] = str(exc)
    if len(raw) > MAX_SPLITS:
        faults["*"] = f"more than {MAX_SPLITS} route splits; the rest ignored"
    if faults:
        log.warning(
            "fleet %s: malformed route splits ignored (stable arm serves): %s",
            rows.pointer.slug,
            "; ".join(f"{m}: {why}" for m, why in sorted(faults.items())),
        )
    return splits, faults


def _split_route(
    rows: store.SnapshotRows, split: Split, row: store.CandidateRow | None
) -> SplitRoute:
    if split.candidate_domain_id == rows.pointer.active_domain_id:
        raise SplitInvalid("candidateDomain is the active domain")
    if row is None:
        return SplitRoute(split, None, "no binding on the candidate domain")
    if row.domain_fleet_id != rows.pointer.fleet_id:
        raise SplitInvalid("candidateDomain belongs to another fleet")
    b = row.binding
    if b.slot_kind != SlotKind.INFERENCE or b.slot_domain_id != row.domain_id:
        raise SplitInvalid("the candidate binding is on a slot that cannot serve it")
    targets = upstream_targets(b.serving_url)
    domain = DomainView(id=row.domain_id, slug="", state=row.domain_state)
    model = _model_view(b)
    if not is_model_routable(domain, model):
        why = f"domain {row.domain_state}, slot {b.slot_state}, server {b.health}"
        return SplitRoute(split, None, why)
    route = Route(
        model=b.name,
        targets=targets,
        continues=engine_continues(b.engine),
        engine=b.engine,
        domain_id=row.domain_id,
    )
    return SplitRoute(split, route)


def parse_ref(ref: str) -> tuple[str, uuid.UUID | None]:
    """Normalize a fleet reference to (alias key, UUID if it reads as one)."""
    key = ref.strip().lower()
    try:
        as_id = uuid.UUID(key)
    except ValueError:
        as_id = None
    if as_id is None and not _SLUG.match(key):
        raise errors.fleet_not_found(f"fleet {clip(ref)!r} not found")
    return key, as_id


def clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class RoutingCache:
    """Snapshots by fleet id, and the alias (slug or UUID spelling) each request used."""

    def __init__(self) -> None:
        self._snapshots: dict[str, Snapshot] = {}
        self._aliases: dict[str, str] = {}
        # One snapshot load per fleet at a time; concurrent requests join it.
        self._loading: dict[str, asyncio.Future] = {}
        self._reads: dict[str, _Reads] = {}
        self._logged: dict[tuple[str, str], float] = {}
        # When each reference's pointer was last read (asked), for the poll-bounded reuse.
        self._checked: dict[str, float] = {}
        # `_fresh`'s answer per reference as the request spelled it, with the moment it stops
        # holding (the poll bound or the TTL, whichever comes first) and the settings it was
        # worked out with: the healthy path's lookup. Emptied whenever the state it was worked
        # out from changes (a pointer read, a snapshot stored or dropped, an alias forgotten);
        # a pushed revision is checked on every use.
        self._fast: dict[str, tuple[float, str, int, Resolved, HaruSettings]] = {}

    def clear(self) -> None:
        self._fast.clear()
        self._checked.clear()
        self._snapshots.clear()
        self._aliases.clear()
        self._loading.clear()
        self._reads.clear()
        self._logged.clear()

    def _pointer_read(self, key: str, as_id: uuid.UUID | None) -> asyncio.Future:
        """Return a future of a pointer read of `key` that starts no earlier than this call.

        Concurrent requests for one fleet share reads: a request arriving while a read is in
        flight waits for the next one, which starts when that read ends. Every request still
        sees a read begun after it arrived (so a pointer move is seen by the very next
        request), while the store answers one query per round instead of one per request.
        """
        loop = asyncio.get_running_loop()
        reads = self._reads.get(key)
        if reads is None or reads.loop is not loop:
            reads = self._reads[key] = _Reads(loop)
            reads.current = loop.create_future()
            self._launch(key, as_id, reads)
            waiting = reads.current
        else:
            if reads.next is None:
                reads.next = loop.create_future()
            waiting = reads.next
        # Shielded: one caller giving up (its timeout) must not cancel the others' read.
        return asyncio.shield(waiting)

    def _launch(self, key: str, as_id: uuid.UUID | None, reads: _Reads) -> None:
        target = reads.current
        assert target is not None  # set by whoever launches the read

        def done(read: asyncio.Future) -> None:
            failure = None if target.done() or read.cancelled() else read.exception()
            if target.done():
                pass
            elif read.cancelled():
                target.cancel()
            elif failure is not None:
                target.set_exception(failure)
                target.exception()  # retrieved: every waiter may have timed out already
            else:
                target.set_result(read.result())
            if reads.next is not None:
                reads.current, reads.next = reads.next, None
                self._launch(key, as_id, reads)
            elif self._reads.get(key) is reads:
                del self._reads[key]

        store.run(store.pointer_read, key, as_id).add_done_callback(done)

    def _fresh(self, ref: str) -> Resolved | None:
        """The cached snapshot, if its pointer was read within the poll bound and no newer
        revision was pushed since: the healthy path then skips the database entirely. The
        answer is kept for `cached` until it stops holding."""
        key = ref.strip().lower()  # only a reference read before can be cached
        fleet_id = self._aliases.get(key)
        if fleet_id is None:
            return None
        cached = self._snapshots.get(fleet_id)
        checked = self._checked.get(key)
        if cached is None or checked is None or FEED.newer(fleet_id, cached.revision):
            return None
        config = haru_settings()
        until = min(
            checked + config.chat_hold_poll_ms / 1000,
            cached.loaded_at + config.snapshot_cache_ttl_ms / 1000,
        )
        if clock.get_clock().monotonic() >= until:
            return None
        resolved = Resolved(cached, stale=False)
        if len(self._fast) < 4096:  # references are client-chosen: keep this bounded
            self._fast[ref] = (until, fleet_id, cached.revision, resolved, config)
        return resolved

    def last(self, ref: str) -> Snapshot | None:
        """The last snapshot loaded for `ref`, however old: never routed on (a continuation
        reads the standby's bindings from it, which no pointer move changes), no read."""
        fleet_id = self._aliases.get(ref.strip().lower())
        return self._snapshots.get(fleet_id) if fleet_id is not None else None

    def cached(self, ref: str, loop: asyncio.AbstractEventLoop | None = None) -> Resolved | None:
        """The snapshot to serve `ref` with if no read is needed (the healthy path: no await);
        `loop` is the running loop, if the caller has it."""
        FEED.ensure_started(loop)
        fast = self._fast.get(ref)
        if fast is not None:
            until, fleet_id, revision, resolved, config = fast
            if (
                config is haru_settings()
                and clock.get_clock().monotonic() < until
                and not FEED.newer(fleet_id, revision)
            ):
                return resolved
        return self._fresh(ref)

    async def resolve(self, ref: str, loop: asyncio.AbstractEventLoop | None = None) -> Resolved:
        """Return the routing snapshot to serve `ref` with, or raise a ProxyError; `loop` is the
        running loop, if the caller has it."""
        fresh = self.cached(ref, loop)
        if fresh is not None:
            return fresh
        key, as_id = parse_ref(ref)
        if store.stalled_for() > POINTER_READ_TIMEOUT_S:
            # The store's one thread is stuck in a read already past the deadline (a frozen
            # database): a new read would queue behind it and only add the whole timeout to
            # this request. Serve what is cached, at once, until that read comes back.
            return self._fail_open(key, TimeoutError())
        asked_at = clock.get_clock().monotonic()
        try:
            async with asyncio.timeout(POINTER_READ_TIMEOUT_S):
                pointer = await self._pointer_read(key, as_id)
        except (store.StoreUnreachable, TimeoutError) as exc:
            return self._fail_open(key, exc)
        except store.StoreUnusable as exc:
            self._note(key, "closed", f"pointer read refused: {exc}")
            raise errors.state_store_unavailable(UNUSABLE) from None
        if pointer is None:
            self._forget_alias(key)
            raise errors.fleet_not_found(f"fleet {clip(ref)!r} not found")
        self._fast.clear()  # the pointer was read: worked out again from it
        self._aliases[key] = pointer.fleet_id
        if len(self._checked) > 4096:  # references are client-chosen: keep this bounded
            self._checked.clear()
        self._checked[key] = asked_at

        cached = self._snapshots.get(pointer.fleet_id)
        if cached is not None and _same_route(cached, pointer):
            ttl_s = haru_settings().snapshot_cache_ttl_ms / 1000
            if clock.get_clock().monotonic() - cached.loaded_at < ttl_s:
                return Resolved(cached, stale=False)
            # Only non-routing state may have changed: if the store drops away between the two
            # reads, the cached routing is still what the pointer says.
            try:
                async with asyncio.timeout(POINTER_READ_TIMEOUT_S):
                    return Resolved(await self._load(pointer), stale=False)
            except (store.StoreUnreachable, TimeoutError):
                self._note(key, "open", "snapshot refresh failed; serving the cached one")
                return Resolved(cached, stale=True)
        if cached is not None:
            # Superseded: the pointer moved. Quarantine it, so that an outage from here on can
            # never serve the old routing.
            self._snapshots.pop(pointer.fleet_id, None)
            self._fast.clear()
        try:
            async with asyncio.timeout(POINTER_READ_TIMEOUT_S):
                return Resolved(await self._load(pointer), stale=False)
        except (store.StoreUnreachable, TimeoutError):
            self._note(key, "closed", "pointer moved and the new snapshot could not be read")
            raise errors.state_store_unavailable(
                "routing changed and the state store stopped answering; retry"
            ) from None

    def _fail_open(self, key: str, exc: Exception) -> Resolved:
        fleet_id = self._aliases.get(key)
        cached = self._snapshots.get(fleet_id) if fleet_id else None
        reason = "timed out" if isinstance(exc, TimeoutError) else str(exc)
        if cached is None:
            self._note(key, "closed", f"state store unreachable ({reason}) and no cached routing")
            raise errors.state_store_unavailable(
                "state store unreachable and no routing cached for this fleet yet"
            )
        self._note(key, "open", f"state store unreachable ({reason}); serving cached routing")
        return Resolved(cached, stale=True)

    async def _load(self, pointer: store.Pointer) -> Snapshot:
        """Load the fleet's snapshot, joining a load already under way when it is fresh enough."""
        fleet_id = pointer.fleet_id
        for _ in range(3):
            pending = self._loading.get(fleet_id)
            if pending is None or pending.get_loop() is not asyncio.get_running_loop():
                pending = asyncio.ensure_future(self._load_once(fleet_id))
                self._loading[fleet_id] = pending
                pending.add_done_callback(self._loaded)
            snapshot = await asyncio.shield(pending)
            # A joined load may have read the fleet before our pointer read: only a snapshot at
            # least as new as what we saw will do.
            if snapshot.revision >= pointer.revision:
                return snapshot
        raise errors.state_store_unavailable("routing kept changing while loading; retry")

    def _loaded(self, load: asyncio.Future) -> None:
        for fleet_id, pending in list(self._loading.items()):
            if pending is load:
                del self._loading[fleet_id]

    async def _load_once(self, fleet_id: str) -> Snapshot:
        loaded_at = clock.get_clock().monotonic()
        try:
            rows = await store.run(store.snapshot_rows_read, fleet_id)
        except store.StoreUnusable as exc:
            self._quarantine(fleet_id, f"snapshot read refused: {exc}")
            raise errors.state_store_unavailable(UNUSABLE) from None
        if rows is None:
            self._forget_fleet(fleet_id)
            raise errors.fleet_not_found("fleet not found")
        try:
            snapshot = snapshot_build(rows, loaded_at)
        except Malformed as exc:
            self._quarantine(fleet_id, str(exc))
            raise errors.state_store_unavailable(
                f"fleet {rows.pointer.slug} has malformed routing state: {exc}"
            ) from None
        current = self._snapshots.get(fleet_id)
        # Never replace a newer snapshot with an older one read concurrently.
        if current is None or snapshot.revision >= current.revision:
            self._snapshots[fleet_id] = snapshot
            self._fast.clear()
        return snapshot

    def _quarantine(self, fleet_id: str, why: str) -> None:
        self._snapshots.pop(fleet_id, None)
        self._fast.clear()
        self._note(fleet_id, "closed", why)

    def _forget_alias(self, key: str) -> None:
        self._fast.clear()
        self._checked.pop(key, None)
        fleet_id = self._aliases.pop(key, None)
        if fleet_id is not None:
            self._forget_fleet(fleet_id)

    def _forget_fleet(self, fleet_id: str) -> None:
        """Drop a gone fleet's snapshot and every alias that led to it."""
        self._fast.clear()
        self._snapshots.pop(fleet_id, None)
        for alias in [a for a, f in self._aliases.items() if f == fleet_id]:
            del self._aliases[alias]
            self._checked.pop(alias, None)

    def _note(self, key: str, verdict: str, message: str) -> None:
        # Rate-limited: during an outage every request takes this path.
        now = time.monotonic()
        if len(self._logged) > 1024:  # references are client-chosen: keep this bounded
            self._logged.clear()
        if now - self._logged.get((key, verdict), -LOG_EVERY_S) >= LOG_EVERY_S:
            self._logged[(key, verdict)] = now
            log.warning("chat proxy fail-%s for fleet %s: %s", verdict, key, message)


class _Reads:
    """The pointer read in flight for one fleet reference, and the one queued behind it."""

    __slots__ = ("loop", "current", "next")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.current: asyncio.Future | None = None
        self.next: asyncio.Future | None = None


def _same_route(snapshot: Snapshot, pointer: store.Pointer) -> bool:
    return (
        snapshot.revision == pointer.revision
        and snapshot.active_domain_id == pointer.active_domain_id
    )


ROUTES = RoutingCache()
