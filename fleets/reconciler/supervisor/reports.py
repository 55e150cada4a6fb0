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
