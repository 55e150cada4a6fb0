"""Render a domain's supervisor config (`HARU_SUPERVISOR_CONFIG`) from the database and its plan.

The config a host runs is derived, not hand-written: GPU indices and each managed server's
`gpuMemoryUtilization` come from the plan stored on the slots, trainers get their budget as
`memoryLimitMiB` (the supervisor hands it over as HARU_GPU_MEMORY_LIMIT_MIB), and the planned
GPUs travel along so the supervisor can check them against its real ones at start-up.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from fleets.core.placement import DEFAULT_SAFETY_MARGIN_MIB
from fleets.core.states import SlotKind
from fleets.layouts.planning import expand_gpus
from fleets.models import Domain, ModelBinding, Slot

DEFAULT_SIM_TOTAL_MIB = 81920
GPU_BACKENDS = ("nvml", "sim")


class SupervisorConfigError(ValueError):
    """The domain cannot be rendered as a supervisor config; nothing was written."""


def _port(binding: ModelBinding, fallback: int | None) -> int:
    port = urlsplit(binding.serving_url).port
    if port is not None:
        return port
    if fallback is None:
        raise SupervisorConfigError(
            f"model {binding.name!r}: its servingUrl {binding.serving_url!r} names no port; "
            "pass --base-port to number the servers from it"
        )
    return fallback


def supervisor_config_render(
    *,
    domain: Domain,
    gpu_backend: str = "nvml",
    sim_state_file: str | None = None,
    base_port: int | None = None,
) -> dict[str, Any]:
    """Return the supervisor config document for `domain` (validated by the supervisor's loader)."""
    if gpu_backend not in GPU_BACKENDS:
        raise SupervisorConfigError(f"unknown GPU backend {gpu_backend!r} (nvml or sim)")
    slots = list(Slot.objects.filter(domain=domain).order_by("gpu_index", "kind"))
    mig = [s for s in slots if s.mig_instance]
    if mig:
        raise SupervisorConfigError(
            f"slot on GPU {mig[0].gpu_index} runs on MIG instance {mig[0].mig_instance!r}; the "
            "supervisor does not address MIG instances yet (see KNOWN_ISSUES.md)"
        )
    gpus, errors = expand_gpus(domain.gpu_layout.get("gpus", []))
    if errors:
        raise SupervisorConfigError("; ".join(errors))
    doc: dict[str, Any] = {
        "host": domain.slug,
        "gpu": _gpu_section(domain, gpus, slots, gpu_backend, sim_state_file),
    }
    if gpus:
        doc["plan"] = {
            "gpus": [
                {"index": g["index"], "type": g["type"], "memoryMiB": g["memoryMiB"]} for g in gpus
            ],
            "safetyMarginMiB": domain.gpu_layout.get("safetyMarginMiB", DEFAULT_SAFETY_MARGIN_MIB),
        }
    next_port = base_port
    rendered = []
    for slot in slots:
        if slot.kind == SlotKind.TRAINING:
            out: dict[str, Any] = {
                "kind": SlotKind.TRAINING.value,
                "gpuIndex": slot.gpu_index,
                "command": list(slot.spec.get("command", [])),
                "checkpointDir": slot.spec.get("checkpointDir", ""),
            }
            if "budgetMiB" in slot.allocation:
                out["memoryLimitMiB"] = slot.allocation["budgetMiB"]
            rendered.append(out)
            continue
        granted = slot.allocation.get("servers", {})
        models = []
        for b in ModelBinding.objects.filter(slot=slot).order_by("name"):
            port = _port(b, next_port)
            if next_port is not None and port == next_port:
                next_port += 1
            m: dict[str, Any] = {"name": b.name, "port": port}
            if b.name in granted:
                m["memoryMiB"] = granted[b.name]["needMiB"]
                m["sleepResidueMiB"] = granted[b.name]["sleepResidueMiB"]
            if b.profile:
                m["profile"] = dict(b.profile)
            models.append(m)
        if models:
            rendered.append(
                {"kind": SlotKind.INFERENCE.value, "gpuIndex": slot.gpu_index, "models": models}
            )
    if not rendered:
        raise SupervisorConfigError(f"domain {domain.slug!r} has no slots to supervise")
    doc["slots"] = rendered
    return doc


def _gpu_section(
    domain: Domain,
    gpus: list[dict[str, Any]],
    slots: list[Slot],
    backend: str,
    sim_state_file: str | None,
) -> dict[str, Any]:
    if backend == "nvml":
        return {"backend": "nvml"}
    if gpus:
        sim = [{"index": g["index"], "totalMiB": g["memoryMiB"], "name": g["type"]} for g in gpus]
    else:
        # A hand-placed layout says nothing about its cards: simulate one per GPU it uses.
        used = sorted({i for s in slots for i in (s.gpu_indices or [s.gpu_index])})
        sim = [{"index": i, "totalMiB": DEFAULT_SIM_TOTAL_MIB, "name": "SIM-GPU"} for i in used]
    return {
        "backend": "sim",
        "simStateFile": sim_state_file or f"var/{domain.slug}/sim-gpu.json",
        "simGpus": sim,
    }
