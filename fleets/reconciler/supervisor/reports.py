"""What a supervisor answers, checked against the wire contract and read into the report model.

Each parser checks a body against its schema in `common/wire` first (a body off the contract is
`BadBody`, the call ends `bad_body`), then reads it once into the frozen values of
`fleets.core.report`: what the reconciler decides on and what the heartbeat stores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.wire import contract
from common.wire.shape import compact
from fleets.core.golden import ProbeAnswer
from fleets.core.report import (
    GpuMemory,
    StatusReport,
    engine_version,
    read_gpus,
    read_status,
)
from fleets.reconciler.supervisor.transport import BadBody


@dataclass(frozen=True)
class ProbeReport:
    ok: bool
    results: tuple[ProbeAnswer, ...]
    # Whether the answers were asked for greedy and seeded: only then are they comparable.
    golden: bool = False

    def result(self, model: str, adapter: str = "") -> ProbeAnswer | None:
        return next((r for r in self.results if r.model == model and r.adapter == adapter), None)


def _checked(schema: str, body: Any, where: str) -> dict[str, Any]:
    """Validate `body` against the wire contract's schema; raise BadBody naming every problem.

    Strict in what we send, lenient in what we accept: a null where the contract says "leave
    it out" (what this supervisor sent before the contract was written down) reads as absent,
    and a whole number where it says integer (`"pid": 12.0`) reads as that int.
    """
    body = compact(body)
    found = contract.problems(schema, body)
    if found:
        raise BadBody(f"{where}: " + "; ".join(found[:5]))
    checked: dict[str, Any] = contract.as_declared(schema, body)
    return checked


def parse_status(body: Any) -> StatusReport:
    """Validate a `GET /v1/status` body (ours or the original supervisor's)."""
    root = _checked("status.response", body, "status")
    return read_status(root, raw=root)


def parse_gpu_memory(body: Any) -> GpuMemory:
    """Validate a `GET /v1/gpu/memory` body (`supervisor/gpu/facts.py` writes it)."""
    root = _checked("gpu-memory.response", body, "gpu memory")
    return GpuMemory(gpus=read_gpus(root["gpus"]), raw=root)


def parse_probe(body: Any) -> ProbeReport:
    """Validate a `POST /v1/probe` body."""
    root = _checked("probe.response", body, "probe")
    results = tuple(
        ProbeAnswer(
            model=r["model"],
            adapter=r.get("adapter") or "",
            ok=r["ok"],
            error=r.get("error"),
            answer=r.get("answer"),
            engine_version=engine_version(r.get("engineVersion")),
            latency_ms=int(r["latencyMs"]),
        )
        for r in root["results"]
    )
    return ProbeReport(ok=root["ok"], results=results)


def parse_ack(body: Any) -> dict[str, Any]:
    """Accept any JSON object (the POST routes answer with a summary we only log)."""
    if not isinstance(body, dict):
        raise BadBody("response: expected an object")
    return body


# -- the adapter API (docs/adapters.md, "The supervisor's adapter API") -------------------------

# Bounds of a listing read: a store holds few adapters, each manifest at most 64 KiB.
MAX_LISTED = 256


@dataclass(frozen=True)
class StoredAdapter:
    """One adapter a supervisor's store holds complete and checked."""

    id: str
    digest: str
    bytes: int
    origin: str  # "trained" | "received"
    checkpoint: str
    manifest: dict[str, Any]


@dataclass(frozen=True)
class LoadedAdapter:
    model: str
    name: str
    id: str


@dataclass(frozen=True)
class AdaptersListing:
    """`GET /v1/adapters`: what the store holds, receives, refused, and what is loaded."""

    adapters: tuple[StoredAdapter, ...]
    incoming: dict[str, dict[str, int]]  # id -> {path: bytes held}
    loaded: tuple[LoadedAdapter, ...]
    rejected: tuple[tuple[str, str], ...] = ()  # (checkpoint, why)

    def stored(self, store_id: str) -> StoredAdapter | None:
        return next((a for a in self.adapters if a.id == store_id), None)

    def is_loaded(self, model: str, name: str) -> bool:
        return any(x.model == model and x.name == name for x in self.loaded)


def _list(root: dict[str, Any], key: str) -> list[Any]:
    value = root.get(key, [])
    if not isinstance(value, list) or len(value) > MAX_LISTED:
        raise BadBody(f"adapters: {key} must be a list of at most {MAX_LISTED}")
    return value


def _str(item: Any, key: str, where: str) -> str:
    value = item.get(key) if isinstance(item, dict) else None
    if not isinstance(value, str) or len(value) > 1000:
        raise BadBody(f"adapters: {where}.{key} must be a string")
    return value


def _size(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadBody(f"adapters: {where} must be a byte count")
    return value


def parse_adapters(body: Any) -> AdaptersListing:
    """Validate a `GET /v1/adapters` body; the manifests are parsed by the registry (one the
    contract refuses is that adapter's rejection, not the listing's)."""
    if not isinstance(body, dict):
        raise BadBody("adapters: expected an object")
    stored = []
    for i, a in enumerate(_list(body, "adapters")):
        where = f"adapters[{i}]"
        manifest = a.get("manifest") if isinstance(a, dict) else None
        if not isinstance(manifest, dict):
            raise BadBody(f"adapters: {where}.manifest must be an object")
        stored.append(
            StoredAdapter(
                id=_str(a, "id", where),
                digest=_str(a, "digest", where),
                bytes=_size(a.get("bytes"), f"{where}.bytes"),
                origin=_str(a, "origin", where),
                checkpoint=a.get("checkpoint") if isinstance(a.get("checkpoint"), str) else "",
                manifest=manifest,
            )
        )
    incoming: dict[str, dict[str, int]] = {}
    for i, a in enumerate(_list(body, "incoming")):
        files = a.get("files") if isinstance(a, dict) else None
        if not isinstance(files, dict) or len(files) > MAX_LISTED:
            raise BadBody(f"adapters: incoming[{i}].files must be an object")
        incoming[_str(a, "id", f"incoming[{i}]")] = {
            str(p): _size(n, f"incoming[{i}].files") for p, n in files.items()
        }
    # `id` is null for a name the engine holds that the supervisor was never asked to load.
    loaded = tuple(
        LoadedAdapter(
            _str(x, "model", f"loaded[{i}]"),
            _str(x, "name", f"loaded[{i}]"),
            x.get("id") if isinstance(x.get("id"), str) else "",
        )
        for i, x in enumerate(_list(body, "loaded"))
    )
    rejected = tuple(
        (_str(x, "checkpoint", f"rejected[{i}]"), _str(x, "why", f"rejected[{i}]"))
        for i, x in enumerate(_list(body, "rejected"))
    )
    return AdaptersListing(tuple(stored), incoming, loaded, rejected)


@dataclass(frozen=True)
class LoadAck:
    loaded: bool
    pending: str | None  # "wake": the server sleeps; it loads on wake


def parse_load(body: Any) -> LoadAck:
    if not isinstance(body, dict) or not isinstance(body.get("loaded"), bool):
        raise BadBody("adapter load: expected {loaded: true|false}")
    pending = body.get("pending")
    return LoadAck(body["loaded"], pending if isinstance(pending, str) else None)
