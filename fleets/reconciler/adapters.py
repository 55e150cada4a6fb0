"""The tick's adapter pass: discover, register, transfer, load, probe, route a first version,
retire (docs/adapters.md, "Registry" to "Failover").

What each supervisor's store holds (`GET /v1/adapters`) is the truth the pass reconciles the
registry against: a copy is `stored` when the store lists it, a transfer resumes from the
sizes the target's incoming copy holds, a load is `loaded` when the store lists it loaded. All
calls happen first, outside any transaction; every write after is a compare-and-swap of
`fleets.services.adapters` on what was read, so two ticks racing write once.

Cheap when nothing moves (issue 27 counts an idle tick's statements): a fleet is looked at only
when one of its supervisors advertises `adapters` and either a training slot's
`lastAdapterAt` moved (a trainer completed an adapter; periodic resume checkpoints do not
count), its adapter routes moved, the last pass left work (a transfer, a load, a probe), or,
for a fleet that routes adapters, LOOK_INTERVAL_S passed (the re-probes, a standby's
reloads); that is remembered per process, in memory. A fleet that never trained an adapter
pays nothing. One pass
is bounded by a deadline: a large transfer goes on at the next tick, from where the target's
incoming copy ends.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from common.adapter_manifest import (
    MANIFEST_NAME,
    ManifestInvalid,
    engine_name,
    manifest_parse,
    store_id,
)
from fleets.base import clock
from fleets.core.adapter_route import AdapterRoute, AdapterRouteInvalid, adapter_routes_parse
from fleets.core.adapters import (
    LOADED_STATES,
    STORED_STATES,
    AdapterVersionState,
    Chunk,
    CopyState,
    probe_failure,
    retry_due,
    transfer_next,
    versions_kept,
)
from fleets.core.policy import Policy
from fleets.models import AdapterCopy, AdapterVersion, Domain, Fleet, Id, ModelBinding
from fleets.reconciler.golden import adapter_answers
from fleets.reconciler.supervisor.client import FEATURE_ADAPTERS, SupervisorClient
from fleets.reconciler.supervisor.peers import learned_features
from fleets.reconciler.supervisor.reports import AdaptersListing
from fleets.reconciler.supervisor.transport import CallError
from fleets.services.adapter_routes import adapter_route_set
from fleets.services.adapters import (
    adapter_register,
    adapter_retire,
    copies_add,
    copy_attempts,
    copy_move,
)

log = logging.getLogger(__name__)

# A fleet whose supervisors serve adapters is looked at at least this often, even when no
# checkpoint moved (a copy lost on a host, a failed copy's retry coming due).
LOOK_INTERVAL_S = 60.0
# One pass's share of a tick: a transfer past it continues next tick.
PASS_BUDGET_S = 3.0
# One supervisor call of the pass never waits longer than this.
CALL_TIMEOUT_S = 5.0
# A probe's call gets at least this, whatever is left of the pass: a CPU engine busy with users
# takes seconds for a few greedy tokens, and a probe cut short by the pass's budget is no
# evidence against the adapter. A copy whose engine answers none of these tries is failed.
PROBE_CALL_TIMEOUT_S = 5.0
PROBE_NO_ANSWER_TRIES = 5
# Bytes per PUT: at most what the supervisor takes (HARU_SUPERVISOR_ADAPTER_CHUNK_BYTES, 4 MiB
# by default there), and all a transfer ever holds in memory.
TRANSFER_CHUNK_BYTES = 1024 * 1024
# Probes of one pass: each eval prompt of each copy is one call.
MAX_PROBES_PER_PASS = 32
# How often a probed copy on the active is asked its prompts again (against its baseline).
REPROBE_INTERVAL_MS = 600_000


@dataclass
class _Look:
    at: float  # time.monotonic() of the last pass
    revision: int  # the fleet's route revision then
    checkpoints: dict[str, str | None]  # domain id -> lastAdapterAt seen then
    busy: bool  # the last pass left work for the next tick


_looks: dict[str, _Look] = {}
# Loads a sleeping standby answered `pending: wake` to: remembered by the supervisor, so not
# asked again each tick ((domain id, model, engine name)).
_pending_loads: set[tuple[str, str, str]] = set()
# Probes a copy's engine did not answer (copy id -> how many in a row): retried, up to
# PROBE_NO_ANSWER_TRIES, before the copy is failed.
_no_answers: dict[int, int] = {}
# Digests already registered by this process (fleet id, digest): the listing repeats them on
# every look, the database need not be asked again.
_known: set[tuple[str, str]] = set()
_lock = threading.Lock()
# Bounds of the memory above (past them it is emptied: one more look each).
_MAX_ENTRIES = 10_000


def forget() -> None:
    """Forget everything remembered (tests)."""
    with _lock:
        _looks.clear()
        _pending_loads.clear()
        _no_answers.clear()
        _known.clear()


def _adapter_capable(urls: Iterable[str]) -> bool:
    return any(FEATURE_ADAPTERS in (learned_features(u) or ()) for u in urls if u)


def adapters_due(
    *,
    fleet_id: Id,
    route_revision: int,
    supervisor_urls: Iterable[str],
    checkpoints: Mapping[str, str | None],
    routes: bool = True,
) -> bool:
    """Whether the pass has anything to look at: no read of the database, no call (what
    each supervisor advertises was learned from its status, in memory).

    `checkpoints`: domain id -> its training slots' `lastAdapterAt`, from this tick's beats
    (a domain not beaten this tick keeps what was seen last); `routes`: whether the fleet
    routes any adapter (only then is it looked at every LOOK_INTERVAL_S)."""
    if not _adapter_capable(supervisor_urls):
        return False
    with _lock:
        look = _looks.get(str(fleet_id))
    if look is None or look.busy or look.revision != route_revision:
        return True
    if any(look.checkpoints.get(d) != at for d, at in checkpoints.items()):
        return True
    return routes and time.monotonic() - look.at >= LOOK_INTERVAL_S


def _remember(
    fleet_id: Id, route_revision: int, checkpoints: Mapping[str, str | None], busy: bool
) -> None:
    with _lock:
        if len(_looks) >= _MAX_ENTRIES:
            _looks.clear()
        old = _looks.get(str(fleet_id))
        seen = {**(old.checkpoints if old else {}), **checkpoints}
        _looks[str(fleet_id)] = _Look(time.monotonic(), route_revision, seen, busy)


@dataclass
class _Pass:
    fleet: Fleet
    policy: Policy
    clients: dict[Any, SupervisorClient]
    listings: dict[Any, AdaptersListing]
    deadline: float
    actor: str
    busy: bool = False
    probes_left: int = MAX_PROBES_PER_PASS

    def timeout(self) -> float:
        return max(0.25, min(CALL_TIMEOUT_S, self.deadline - time.monotonic()))

    def out_of_time(self) -> bool:
        return time.monotonic() >= self.deadline


def adapters_pass(
    *,
    fleet_id: Id,
    policy: Policy,
    client_for: Callable[[Domain], SupervisorClient],
    checkpoints: Mapping[str, str | None] | None = None,
    actor: str = "reconciler",
    budget_s: float = PASS_BUDGET_S,
) -> bool:
    """Run one bounded pass over the fleet's adapters; return whether work is left (the next
    tick looks again whatever moved)."""
    fleet = Fleet.objects.filter(pk=fleet_id).first()
    if fleet is None:
        return False
    domains = [d for d in Domain.objects.filter(fleet_id=fleet_id) if d.supervisor_url]
    clients = {d.id: client_for(d) for d in domains}
    p = _Pass(fleet, policy, clients, {}, time.monotonic() + budget_s, actor)
    for domain_id, client in clients.items():
        if not client.takes_adapters():
            continue
        listed = client.adapters_list(timeout=p.timeout())
        if listed.value is not None:
            p.listings[domain_id] = listed.value
        # Unreachable or refusing now: not "busy" on that alone, or a supervisor that
        # advertises adapters but cannot list them (a partition, a broken store) would cost a
        # pass on every tick; its next completed adapter, a route move or the periodic look
        # brings the pass back, and work left on the others keeps it busy.
    _register(p)
    routes = _routes(fleet)
    versions = list(
        AdapterVersion.objects.filter(
            fleet_id=fleet_id, state=AdapterVersionState.REGISTERED.value
        ).prefetch_related("copies")
    )
    by_name: dict[str, list[int]] = {}
    for v in versions:
        by_name.setdefault(v.name, []).append(v.version)
    routed = {name: r.versions() for name, r in routes.items()}
    kept = versions_kept(by_name, routed, policy.adapter_keep_versions)
    binds = _binding_domains(fleet_id)
    for v in versions:
        copies = list(v.copies.all())
        lacking = binds.get(v.base_model, set()) - {c.domain_id for c in copies}
        if lacking:
            copies += copies_add(version=v, domain_ids=lacking)
        for c in copies:
            c.adapter = v  # the prefetched row: no read per copy
            _sync(p, v, c)
        if v.version not in kept.get(v.name, frozenset()):
            _retire(p, v, copies)
            continue
        for c in copies:
            if not p.out_of_time():
                _transfer(p, v, c, copies)
        _load_and_probe(p, v, copies, routes.get(v.name), max(by_name[v.name]))
    _first_routes(p, versions, routes)
    _remember(fleet_id, fleet.route_revision, checkpoints or {}, p.busy)
    return p.busy


def _binding_domains(fleet_id: Id) -> dict[str, set[Any]]:
    """Base model name -> the domains that bind it (where each of its versions has a copy)."""
    out: dict[str, set[Any]] = {}
    for domain_id, name in ModelBinding.objects.filter(domain__fleet_id=fleet_id).values_list(
        "domain_id", "name"
    ):
        out.setdefault(name, set()).add(domain_id)
    return out


def _routes(fleet: Fleet) -> dict[str, AdapterRoute]:
    try:
        return adapter_routes_parse(fleet.adapter_routes)
    except AdapterRouteInvalid as exc:
        log.warning("fleet %s: adapter routes unreadable: %s", fleet.slug, exc)
        return {}


# -- 1. registration ----------------------------------------------------------------------------


def _register(p: _Pass) -> None:
    """Register every adapter a store lists that this fleet has not registered yet."""
    fleet_id = str(p.fleet.id)
    for domain_id, listing in p.listings.items():
        for stored in listing.adapters:
            with _lock:
                if (fleet_id, stored.digest) in _known:
                    continue
            try:
                reg = adapter_register(
                    fleet_id=p.fleet.id,
                    manifest=stored.manifest,
                    # A copy another domain received was registered from its source first.
                    source_domain_id=domain_id if stored.origin == "trained" else None,
                    checkpoint=stored.checkpoint,
                    actor=p.actor,
                )
            except ManifestInvalid as exc:
                log.warning("fleet %s: adapter %s not registered: %s", p.fleet.slug, stored.id, exc)
                reg = None
            if reg is not None and reg.created:
                p.busy = True
            with _lock:
                if len(_known) >= _MAX_ENTRIES:
                    _known.clear()
                _known.add((fleet_id, stored.digest))


# -- 2. what each store says ----------------------------------------------------------------------


def _sync(p: _Pass, v: AdapterVersion, c: AdapterCopy) -> None:
    """Move a copy to what its domain's store lists (nothing when the store was not read)."""
    listing = p.listings.get(c.domain_id)
    if listing is None:
        return
    store_id = _store_id(v)
    held = listing.stored(store_id) is not None
    loaded = listing.is_loaded(v.base_model, engine_name(v.name, v.version))
    state = CopyState(c.state)
    if state == CopyState.FAILED:
        ago = int((clock.now() - c.updated_at).total_seconds() * 1000)
        if retry_due(copy_attempts(c), ago):
            to = CopyState.STORED if held else CopyState.ABSENT
            copy_move(copy=c, to_state=to, why="retry after a failure", actor=p.actor)
        return
    if state in (CopyState.ABSENT, CopyState.TRANSFERRING) and held:
        copy_move(copy=c, to_state=CopyState.STORED, actor=p.actor, bytes_stored=v.size_bytes)
    elif state in STORED_STATES and not held:
        copy_move(
            copy=c,
            to_state=CopyState.ABSENT,
            why="no longer in the store",
            actor=p.actor,
            bytes_stored=0,
        )
    elif state in LOADED_STATES and not loaded:
        # The engine no longer has it (a restart, a sleep): it loads again, and proves itself
        # against its own baseline again.
        copy_move(copy=c, to_state=CopyState.STORED, why="no longer loaded", actor=p.actor)
    elif state == CopyState.STORED and loaded:
        copy_move(copy=c, to_state=CopyState.LOADED, actor=p.actor, loaded_at=clock.now())


def _store_id(v: AdapterVersion) -> str:
    return store_id(v.digest)


# -- 3. transfer ----------------------------------------------------------------------------------


def _transfer(p: _Pass, v: AdapterVersion, c: AdapterCopy, copies: list[AdapterCopy]) -> None:
    """Relay a missing copy from a domain whose store holds it (the source first) to its
    domain, chunk by chunk, from what the target's incoming copy already holds."""
    if c.state not in (CopyState.ABSENT.value, CopyState.TRANSFERRING.value):
        return
    listing = p.listings.get(c.domain_id)
    target = p.clients.get(c.domain_id)
    if listing is None or target is None:
        return
    sid = _store_id(v)
    holders = [
        d for d, lst in p.listings.items() if d != c.domain_id and lst.stored(sid) is not None
    ]
    holders.sort(key=lambda d: d != v.source_domain_id)
    if not holders:
        p.busy = True  # no store holds it yet (or none answered)
        return
    source = p.clients[holders[0]]
    p.busy = True
    if c.state == CopyState.ABSENT.value and not copy_move(
        copy=c, to_state=CopyState.TRANSFERRING, actor=p.actor
    ):
        return
    manifest = manifest_parse(v.manifest)
    incoming = dict(listing.incoming.get(sid, {}))
    # The manifest goes first (the target bounds what follows by it), written from the
    # registry's record the way a trainer writes it: the same bytes on every try, so a cut
    # PUT resumes like any file.
    text = json.dumps(manifest.as_json(), indent=1, sort_keys=True).encode()
    held = incoming.get(MANIFEST_NAME, 0)
    if held > len(text):
        copy_move(copy=c, to_state=CopyState.FAILED, why="the target's manifest is longer")
        return
    if held < len(text):
        put = target.adapter_put(
            store_id=sid, path=MANIFEST_NAME, offset=held, data=text[held:], timeout=p.timeout()
        )
        if put.error is not None:
            log.info("fleet %s: transfer of %s: %s", p.fleet.slug, v, put.error.message)
            return
        incoming[MANIFEST_NAME] = len(text)
    files = {f.path: int(n) for f, n in ((f, incoming.get(f.path, 0)) for f in manifest.files)}
    while not p.out_of_time():
        try:
            chunk = transfer_next(manifest, files)
        except ValueError as exc:
            copy_move(copy=c, to_state=CopyState.FAILED, why=str(exc), actor=p.actor)
            return
        if chunk is None:
            _commit(p, v, c, target, sid)
            return
        sent, error = _relay(p, source, target, sid, chunk)
        files[chunk.path] = chunk.offset + sent
        if error is not None:
            if error.code == "offset_mismatch":
                return  # another relay moved it: the next listing says where it stands
            log.info("fleet %s: transfer of %s: %s", p.fleet.slug, v, error.message)
            return
    if sum(files.values()) != c.bytes_stored:
        copy_move(
            copy=c, to_state=CopyState.TRANSFERRING, actor=p.actor, bytes_stored=sum(files.values())
        )


def _relay(
    p: _Pass, source: SupervisorClient, target: SupervisorClient, store_id: str, chunk: Chunk
) -> tuple[int, CallError | None]:
    """Stream one file from `chunk.offset` through to the target, TRANSFER_CHUNK_BYTES per PUT
    (all this holds in memory); stop at the pass's deadline. Return bytes the target took."""
    sent = 0
    offset = chunk.offset
    with source.adapter_file(
        store_id=store_id, path=chunk.path, offset=offset, timeout=p.timeout()
    ) as (blocks, error):
        if error is not None or blocks is None:
            return 0, error
        buffer = bytearray()

        def put(data: bytes) -> CallError | None:
            nonlocal offset, sent
            answer = target.adapter_put(
                store_id=store_id, path=chunk.path, offset=offset, data=data, timeout=p.timeout()
            )
            if answer.error is not None:
                return answer.error
            offset += len(data)
            sent += len(data)
            return None

        for block in blocks:
            buffer += block
            while len(buffer) >= TRANSFER_CHUNK_BYTES:
                failed = put(bytes(buffer[:TRANSFER_CHUNK_BYTES]))
                if failed is not None:
                    return sent, failed
                del buffer[:TRANSFER_CHUNK_BYTES]
            if p.out_of_time() or offset + len(buffer) >= chunk.size:
                break
        if buffer:
            failed = put(bytes(buffer[: chunk.size - offset]))
            if failed is not None:
                return sent, failed
    return sent, None


def _commit(
    p: _Pass, v: AdapterVersion, c: AdapterCopy, target: SupervisorClient, store_id: str
) -> None:
    done = target.adapter_commit(store_id=store_id, digest=v.digest, timeout=p.timeout())
    if done.error is None:
        copy_move(copy=c, to_state=CopyState.STORED, actor=p.actor, bytes_stored=v.size_bytes)
    elif done.error.code == "digest_mismatch":
        # The target deleted its incoming copy: the retry starts from byte 0.
        copy_move(
            copy=c,
            to_state=CopyState.FAILED,
            why=f"digest mismatch on commit: {done.error.message}",
            actor=p.actor,
            bytes_stored=0,
        )


# -- 4. load and probe ----------------------------------------------------------------------------


def _load_and_probe(
    p: _Pass, v: AdapterVersion, copies: list[AdapterCopy], route: AdapterRoute | None, newest: int
) -> None:
    """Load on the active what the route names and the newest version (so a rollout can check
    it), probe each loaded copy there; on a standby, ask for the routed versions (the sleeping
    server loads them on wake)."""
    routed = route is not None and v.version in route.versions()
    newer = v.version == newest and (route is None or v.version > max(route.versions()))
    active_id = p.fleet.active_domain_id
    for c in copies:
        listing = p.listings.get(c.domain_id)
        client = p.clients.get(c.domain_id)
        if listing is None or client is None or p.out_of_time():
            continue
        on_active = c.domain_id == active_id
        if c.state == CopyState.STORED.value and (routed or (on_active and newer)):
            _load(p, v, c, client, on_active)
        if on_active and (c.state == CopyState.LOADED.value or _reprobe_due(c)):
            _probe(p, v, c, client)


def _reprobe_due(c: AdapterCopy) -> bool:
    """A probed copy on the active proves itself against its baseline again this often: an
    engine can go on listing an adapter it no longer applies."""
    if c.state != CopyState.PROBED.value or c.probed_at is None:
        return False
    return (clock.now() - c.probed_at).total_seconds() * 1000 >= REPROBE_INTERVAL_MS


def _load(
    p: _Pass, v: AdapterVersion, c: AdapterCopy, client: SupervisorClient, on_active: bool
) -> None:
    name = engine_name(v.name, v.version)
    pending = (str(c.domain_id), v.base_model, name)
    with _lock:
        if not on_active and pending in _pending_loads:
            return
    ack = client.adapter_load(
        model=v.base_model, name=name, store_id=_store_id(v), timeout=p.timeout()
    )
    if ack.value is not None and ack.value.loaded:
        copy_move(copy=c, to_state=CopyState.LOADED, actor=p.actor, loaded_at=clock.now())
        p.busy = on_active  # its probe next
    elif ack.value is not None:
        with _lock:
            if len(_pending_loads) >= _MAX_ENTRIES:
                _pending_loads.clear()
            _pending_loads.add(pending)
        p.busy = p.busy or on_active
    elif ack.error is not None and ack.error.status is not None and 400 <= ack.error.status < 500:
        copy_move(
            copy=c,
            to_state=CopyState.FAILED,
            why=f"load refused: {ack.error.message}",
            actor=p.actor,
        )
    else:
        p.busy = True


def _probe(p: _Pass, v: AdapterVersion, c: AdapterCopy, client: SupervisorClient) -> None:
    manifest = manifest_parse(v.manifest)
    if p.probes_left < len(manifest.eval):
        p.busy = True
        return
    p.probes_left -= len(manifest.eval)
    timeout = max(p.timeout(), PROBE_CALL_TIMEOUT_S)
    answers, trouble = adapter_answers(client, v, manifest.eval, timeout=timeout)
    if trouble is not None:
        with _lock:
            tries = _no_answers[c.id] = _no_answers.get(c.id, 0) + 1
            if len(_no_answers) > _MAX_ENTRIES:
                _no_answers.clear()
        if tries >= PROBE_NO_ANSWER_TRIES:
            silent = f"probe: no answer in {tries} tries: {trouble}"
            copy_move(copy=c, to_state=CopyState.FAILED, why=silent, actor=p.actor)
            with _lock:
                _no_answers.pop(c.id, None)
            return
        log.info("fleet %s: probe of %s (try %s): %s", p.fleet.slug, v, tries, trouble)
        p.busy = True
        return
    with _lock:
        _no_answers.pop(c.id, None)
    why = probe_failure(manifest.eval, answers, c.baseline or {})
    if why is not None:
        copy_move(copy=c, to_state=CopyState.FAILED, why=f"probe: {why}", actor=p.actor)
        return
    baseline = c.baseline or {k: a for k, a in answers.items() if a is not None}
    copy_move(
        copy=c, to_state=CopyState.PROBED, actor=p.actor, baseline=baseline, probed_at=clock.now()
    )
    p.busy = True  # a first route may follow


# -- 5. a first version's route -------------------------------------------------------------------


def _first_routes(
    p: _Pass, versions: list[AdapterVersion], routes: Mapping[str, AdapterRoute]
) -> None:
    """An adapter name without a route gets one to its newest version probed on the active:
    the first version goes live after its checks; later ones go through the adapter rollout."""
    active_id = p.fleet.active_domain_id
    best: dict[str, AdapterVersion] = {}
    for v in versions:
        if v.name in routes:
            continue
        probed = any(
            c.domain_id == active_id and c.state == CopyState.PROBED.value for c in v.copies.all()
        )
        if probed and (v.name not in best or v.version > best[v.name].version):
            best[v.name] = v
    revision = p.fleet.route_revision
    for name, v in sorted(best.items()):
        try:
            moved = adapter_route_set(
                fleet_id=p.fleet.id,
                name=name,
                route=AdapterRoute(base=v.base_model, version=v.version),
                expected_revision=revision,
                actor=p.actor,
                reason="first version probed on the active",
            )
        except AdapterRouteInvalid as exc:
            log.warning("fleet %s: adapter route %s not set: %s", p.fleet.slug, name, exc)
            continue
        if moved is None:
            p.busy = True  # the revision moved under us: next tick
            return
        revision = moved


# -- 6. retention ---------------------------------------------------------------------------------


def _retire(p: _Pass, v: AdapterVersion, copies: list[AdapterCopy]) -> None:
    """A version neither routed nor among the newest kept: unload it, delete it from every
    store, then retire it (the row stays: its number is never reused)."""
    store_id = _store_id(v)
    name = engine_name(v.name, v.version)
    remaining = False
    for c in copies:
        if c.state == CopyState.REMOVED.value:
            continue
        listing = p.listings.get(c.domain_id)
        client = p.clients.get(c.domain_id)
        if listing is None or client is None:
            remaining = remaining or c.state != CopyState.ABSENT.value
            continue
        if listing.is_loaded(v.base_model, name):
            client.adapter_unload(model=v.base_model, name=name, timeout=p.timeout())
            with _lock:
                _pending_loads.discard((str(c.domain_id), v.base_model, name))
        if listing.stored(store_id) is not None:
            gone = client.adapter_delete(store_id=store_id, timeout=p.timeout())
            remaining = remaining or gone.error is not None
    if remaining:
        p.busy = True
        return
    adapter_retire(version=v, actor=p.actor)


def checkpoints_of(beats: Iterable[object]) -> dict[str, str | None]:
    """Domain id -> the latest `lastAdapterAt` of its training slots (a completed adapter's
    marker), from heartbeats that answered (`fleets.reconciler.heartbeat.Beat`)."""
    out: dict[str, str | None] = {}
    for beat in beats:
        call = getattr(beat, "call", None)
        report = call.value if call is not None else None
        if report is None:
            continue
        times = [
            s.training.adapter_at
            for s in report.slots
            if s.training is not None and s.training.adapter_at is not None
        ]
        out[str(beat.domain.id)] = max(times).isoformat() if times else None  # type: ignore[attr-defined]
    return out
