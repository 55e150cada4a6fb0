"""The host's config (`HARU_SUPERVISOR_CONFIG`): slots, models, trainers and the GPU backend.

Parsing is strict (the structure is `schemas/config.json`'s, checked through
`common/documents.py`): unknown fields are refused and every error names its JSON path and rule,
because a supervisor that starts with a half-understood config is worse than one that refuses.
Relative paths (checkpoint dirs, the simulated GPU state file, the state dir) resolve against the
working directory the supervisor was started in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.documents import problems, schema_validator
from common.strict_json import ConfigError
from common.wire import bounded_json
from supervisor.engines.profile import EngineProfile, GpuSpec, parse_profile
from supervisor.engines.registry import EngineRegistry, default_registry
from supervisor.secrets import SecretRef

DEFAULT_GRACE_MS = 30_000
DEFAULT_DRAIN_BUDGET_MS = 30_000
DEFAULT_SIM_GPU = {"index": 0, "totalMiB": 81920, "name": "SIM-H100", "computeCapability": "9.0"}
# A swap's port range is scanned port by port for a free one; a range wider than this is a slip.
MAX_SWAP_PORTS = 1024
# Engines an unmanaged server may be: each has an HTTP sleep protocol. llama.cpp has none, so
# the supervisor can only put it on standby by stopping a process it started itself.
UNMANAGED_ENGINES = ("vllm", "sglang", "sim")


@dataclass(frozen=True)
class ModelConfig:
    """One model server on an inference slot."""

    name: str
    port: int
    gpu_index: int
    engine: str
    profile: EngineProfile | None
    path: str
    # The model server's own API key (vLLM's --api-key), by reference; sent on every call.
    api_key: SecretRef | None = None
    # From the plan: what the server holds per GPU awake, and what it keeps asleep. The
    # pre-wake check needs `memory_mib - sleep_residue_mib` free on each of its GPUs.
    memory_mib: int | None = None
    sleep_residue_mib: int | None = None

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return self.profile.gpu_indices if self.profile else (self.gpu_index,)

    @property
    def wake_mib(self) -> int | None:
        """MiB a wake adds on each of its GPUs, or None when the config does not say."""
        if self.memory_mib is None:
            return None
        return max(0, self.memory_mib - (self.sleep_residue_mib or 0))

    @property
    def managed(self) -> bool:
        """Whether the supervisor starts this server itself (it has a profile)."""
        return self.profile is not None


@dataclass(frozen=True)
class InferenceSlotConfig:
    gpu_index: int
    models: tuple[ModelConfig, ...]
    kind: str = "inference"


@dataclass(frozen=True)
class TrainingSlotConfig:
    gpu_index: int
    command: tuple[str, ...]
    checkpoint_dir: Path
    grace_ms: int
    kind: str = "training"
    # The plan's budget, handed to the trainer as HARU_GPU_MEMORY_LIMIT_MIB.
    memory_limit_mib: int | None = None


@dataclass(frozen=True)
class SimGpuConfig:
    index: int
    total_mib: int
    name: str
    compute_capability: str
    uuid: str | None = None


@dataclass(frozen=True)
class GpuConfig:
    backend: str  # "nvml" or "sim"
    sim_state_file: Path | None = None
    sim_gpus: tuple[SimGpuConfig, ...] = ()


SlotConfig = InferenceSlotConfig | TrainingSlotConfig


@dataclass(frozen=True)
class PlannedGpu:
    """A GPU the control plane's plan assumed: checked against the real one at start-up."""

    index: int
    type: str
    memory_mib: int


@dataclass(frozen=True)
class PlanConfig:
    gpus: tuple[PlannedGpu, ...] = ()
    safety_margin_mib: int = 0


@dataclass(frozen=True)
class SupervisorConfig:
    slots: tuple[SlotConfig, ...]
    gpu: GpuConfig
    host: str | None = None
    # Where started processes are recorded for adoption; None: the default (`state_dir_for`).
    state_dir: Path | None = None
    # How long a sleep first lets running requests finish (0: no drain, abort them at once).
    drain_budget_ms: int = 30_000
    # What `manage.py supervisor_config` planned; empty for a hand-written config.
    plan: PlanConfig = PlanConfig()
    # Where a swap in mode new-port may start a server: (first, last), both included; None: no
    # such swap on this host (supervisor/swaps.py).
    swap_ports: tuple[int, int] | None = None

    @property
    def models(self) -> tuple[ModelConfig, ...]:
        return tuple(m for s in self.slots if isinstance(s, InferenceSlotConfig) for m in s.models)

    @property
    def training_slots(self) -> tuple[TrainingSlotConfig, ...]:
        return tuple(s for s in self.slots if isinstance(s, TrainingSlotConfig))

    @property
    def inference_slots(self) -> tuple[InferenceSlotConfig, ...]:
        return tuple(s for s in self.slots if isinstance(s, InferenceSlotConfig))


def read_config_source(source: str, cwd: Path) -> tuple[Any, str]:
    """Return (parsed JSON, where it came from) for inline JSON or a file path."""
    text = source.strip()
    if text.startswith("{"):
        origin = "HARU_SUPERVISOR_CONFIG (inline JSON)"
    else:
        path = Path(text).expanduser()
        if not path.is_absolute():
            path = cwd / path
        origin = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError([f"(root): cannot read config file {path}: {exc.strerror}"]) from exc
        except UnicodeDecodeError as exc:
            line = exc.object[: exc.start].count(b"\n") + 1
            raise ConfigError(
                [
                    f"(root): config file {path} is not UTF-8 (byte 0x{exc.object[exc.start]:02x} "
                    f"on line {line}); save it as UTF-8"
                ]
            ) from None
    try:
        # Bounded and strict: a key written twice would otherwise keep its last value silently.
        return bounded_json.loads(text), origin
    except bounded_json.JSONRefused as exc:
        cause = exc.__cause__
        if isinstance(cause, json.JSONDecodeError):
            message = f"(root): {origin} is not valid JSON: {cause.msg} at line {cause.lineno}"
        elif isinstance(cause, RecursionError):
            message = f"(root): {origin} is not valid JSON: {exc}"
        else:
            message = f"{exc} (in {origin})"
        raise ConfigError([message]) from exc


def load_config(
    source: str, *, cwd: Path, registry: EngineRegistry | None = None
) -> SupervisorConfig:
    """Read and validate a config from inline JSON or a file path; raise ConfigError."""
    data, _ = read_config_source(source, cwd)
    return parse_config(data, cwd=cwd, registry=registry)


def parse_config(
    data: Any, *, cwd: Path, registry: EngineRegistry | None = None
) -> SupervisorConfig:
    """Validate a parsed config document; raise ConfigError listing every problem.

    The structure (types, ranges, required and unknown fields) is `schemas/config.json`'s; a
    document that passes it gets the semantic pass below (names, the sim backend's fields,
    secret references, engine profiles, rules across slots).
    """
    registry = registry or default_registry()
    structural = problems(schema_validator("supervisor", "config"), data)
    if structural:
        raise ConfigError([f"{where}: {rule}" for where, rule in structural])
    errors: list[str] = []
    gpu = _parse_gpu(data.get("gpu"), errors, cwd)
    slots = _parse_slots(data["slots"], errors, cwd, registry)
    if not errors:
        _check_cross_slot_rules(slots, gpu, errors, registry)
    swap_ports = _parse_swap_ports(data.get("swapPorts"), slots, errors)
    if errors:
        raise ConfigError(errors)
    state_dir = data.get("stateDir")
    return SupervisorConfig(
        slots=tuple(slots),
        gpu=gpu,
        host=data.get("host"),
        state_dir=_resolve(cwd, state_dir) if state_dir else None,
        drain_budget_ms=data.get("drainBudgetMs", DEFAULT_DRAIN_BUDGET_MS),
        plan=_parse_plan(data.get("plan")),
        swap_ports=swap_ports,
    )


def _parse_swap_ports(
    raw: dict[str, Any] | None, slots: list[SlotConfig], errors: list[str]
) -> tuple[int, int] | None:
    if raw is None:
        return None
    first, last = raw["first"], raw["last"]
    if first > last:
        errors.append(f"swapPorts.last: must be at least first ({first}), got {last}")
        return None
    if last - first + 1 > MAX_SWAP_PORTS:
        errors.append(f"swapPorts: spans {last - first + 1} ports; at most {MAX_SWAP_PORTS}")
        return None
    for slot in slots:
        if isinstance(slot, InferenceSlotConfig):
            for model in slot.models:
                if first <= model.port <= last:
                    # A configured port in the range would be skipped anyway, but an operator
                    # who wrote it there most likely meant another range.
                    errors.append(
                        f"swapPorts: {model.path}.port {model.port} is inside the range; keep "
                        "the configured ports out of it"
                    )
    return first, last


def _parse_plan(raw: dict[str, Any] | None) -> PlanConfig:
    if raw is None:
        return PlanConfig()
    gpus = tuple(PlannedGpu(g["index"], g["type"], g["memoryMiB"]) for g in raw["gpus"])
    return PlanConfig(gpus=gpus, safety_margin_mib=raw.get("safetyMarginMiB", 0))


def state_dir_for(config: SupervisorConfig, *, port: int, cwd: Path) -> Path:
    """Return the state dir: `stateDir` if set, else one per supervisor port.

    Keyed by port because the port is what makes a supervisor unique on a machine (only one can
    bind it), so two supervisors on one host never share records. With the simulated backend
    it sits next to the simulated GPU state file, keeping a demo's or a test's files together.
    """
    if config.state_dir is not None:
        return config.state_dir
    if config.gpu.backend == "sim" and config.gpu.sim_state_file is not None:
        return config.gpu.sim_state_file.parent / f"supervisor-{port}"
    return cwd / "var" / f"supervisor-{port}"


def _parse_gpu(raw: dict[str, Any] | None, errors: list[str], cwd: Path) -> GpuConfig:
    raw = raw or {}
    state_file = raw.get("simStateFile")
    if raw.get("backend", "nvml") == "nvml":
        for key in ("simStateFile", "simGpus"):
            if key in raw:
                errors.append(f'gpu.{key}: is only for backend "sim"')
        return GpuConfig(backend="nvml")
    if state_file is None:
        errors.append('gpu.simStateFile: is required for backend "sim"')
    sim_gpus: list[SimGpuConfig] = []
    seen: dict[int, str] = {}
    for i, g in enumerate(raw.get("simGpus", [DEFAULT_SIM_GPU])):
        path = f"gpu.simGpus[{i}]"
        if g["index"] in seen:
            errors.append(
                f"{path}.index: GPU {g['index']} is already declared at {seen[g['index']]}"
            )
            continue
        seen[g["index"]] = path
        sim_gpus.append(
            SimGpuConfig(
                g["index"],
                g["totalMiB"],
                g.get("name", "SIM-GPU"),
                g.get("computeCapability", "9.0"),
                g.get("uuid"),
            )
        )
    return GpuConfig(
        backend="sim",
        sim_state_file=_resolve(cwd, state_file) if state_file else None,
        sim_gpus=tuple(sim_gpus),
    )


def _parse_slots(
    raw: list[dict[str, Any]], errors: list[str], cwd: Path, registry: EngineRegistry
) -> list[SlotConfig]:
    slots: list[SlotConfig] = []
    seen_slot: dict[tuple[int, str], str] = {}
    for i, item in enumerate(raw):
        path = f"slots[{i}]"
        gpu_index = item["gpuIndex"]
        slot: SlotConfig | None
        if item["kind"] == "inference":
            slot = _parse_inference(item, path, errors, registry, cwd)
        else:
            slot = TrainingSlotConfig(
                gpu_index=gpu_index,
                command=tuple(item["command"]),
                checkpoint_dir=_resolve(cwd, item["checkpointDir"]),
                grace_ms=item.get("graceMs", DEFAULT_GRACE_MS),
                memory_limit_mib=item.get("memoryLimitMiB"),
            )
        if slot is None:
            continue
        key = (gpu_index, slot.kind)
        if key in seen_slot:
            # The control plane addresses slots by (GPU, kind); two would be indistinguishable.
            errors.append(
                f"{path}: a {slot.kind} slot on GPU {gpu_index} is already declared at "
                f"{seen_slot[key]}; (gpuIndex, kind) must be unique"
            )
            continue
        seen_slot[key] = path
        slots.append(slot)
    return slots


def _parse_inference(
    item: dict[str, Any], path: str, errors: list[str], registry: EngineRegistry, cwd: Path
) -> InferenceSlotConfig | None:
    gpu_index = item["gpuIndex"]
    models = [
        _parse_model(raw, f"{path}.models[{j}]", errors, gpu_index, registry, cwd)
        for j, raw in enumerate(item["models"])
    ]
    kept = tuple(m for m in models if m is not None)
    if len(kept) != len(models):
        return None
    return InferenceSlotConfig(gpu_index=gpu_index, models=kept)


def _parse_model(
    raw: dict[str, Any],
    path: str,
    errors: list[str],
    gpu_index: int,
    registry: EngineRegistry,
    cwd: Path,
) -> ModelConfig | None:
    before = len(errors)
    name: str = raw["name"]
    if name != name.lower():
        # Routing keys are lowercase and matched exactly; "Qwen" would never be routed to.
        errors.append(f"{path}.name: must be lowercase")
    elif any(c.isspace() for c in name):
        errors.append(f"{path}.name: must not contain whitespace")
    engine = raw.get("engine")
    api_key = parse_secret_ref(raw.get("apiKey"), f"{path}.apiKey", errors, cwd)
    profile = None
    if raw.get("profile") is not None:
        profile = parse_profile(
            raw["profile"],
            f"{path}.profile",
            errors,
            model_name=name,
            default_gpu_index=gpu_index,
            engine_names=registry.names(),
        )
        if profile is not None:
            if engine is not None and engine != profile.engine:
                errors.append(
                    f'{path}.engine: is "{engine}" but the profile says "{profile.engine}"'
                )
            if gpu_index not in profile.gpu_indices:
                errors.append(
                    f"{path}.profile: runs on GPUs {list(profile.gpu_indices)}, which do not "
                    f"include the slot's GPU {gpu_index}"
                )
            for problem in registry.get(profile.engine).validate(profile, {}):
                errors.append(f"{path}.profile: {problem}")
    elif engine is not None and engine not in UNMANAGED_ENGINES:
        if engine in registry.names():
            errors.append(
                f'{path}.engine: "{engine}" cannot sleep over HTTP; give the model a profile so '
                "the supervisor can stop and start it"
            )
        else:
            errors.append(
                f'{path}.engine: unknown engine "{engine}" (known: {", ".join(registry.names())})'
            )
    if len(errors) > before:
        return None
    return ModelConfig(
        name=name,
        port=raw["port"],
        gpu_index=gpu_index,
        engine=profile.engine if profile else (engine or "vllm"),
        profile=profile,
        path=path,
        api_key=api_key,
        memory_mib=raw.get("memoryMiB"),
        sleep_residue_mib=raw.get("sleepResidueMiB"),
    )


def parse_secret_ref(
    raw: dict[str, Any] | None, path: str, errors: list[str], cwd: Path
) -> SecretRef | None:
    """`{"env": NAME}` or `{"file": PATH}`: a key by reference, never the key itself."""
    if raw is None:
        return None
    env, file = raw.get("env"), raw.get("file")
    if (env is None) == (file is None):
        errors.append(f'{path}: must name exactly one of "env" (a variable) or "file" (a path)')
        return None
    return SecretRef(env=env, file=_resolve(cwd, file) if file else None)


def _check_cross_slot_rules(
    slots: list[SlotConfig], gpu: GpuConfig, errors: list[str], registry: EngineRegistry
) -> None:
    names: dict[str, str] = {}
    ports: dict[int, str] = {}
    for slot in slots:
        if not isinstance(slot, InferenceSlotConfig):
            continue
        for model in slot.models:
            if model.name in names:
                errors.append(
                    f'{model.path}.name: "{model.name}" is already used by {names[model.name]}; '
                    "model names must be unique on the host"
                )
            names.setdefault(model.name, model.path)
            if model.port in ports:
                errors.append(
                    f"{model.path}.port: {model.port} is already used by {ports[model.port]}"
                )
            ports.setdefault(model.port, model.path)
    _check_shared_gpu_budget(slots, errors)
    if gpu.backend == "sim":
        known = {g.index for g in gpu.sim_gpus}
        for i, slot in enumerate(slots):
            indices = {slot.gpu_index}
            if isinstance(slot, InferenceSlotConfig):
                for m in slot.models:
                    if m.profile:
                        indices.update(m.profile.gpu_indices)
            for index in sorted(indices - known):
                errors.append(
                    f"slots[{i}].gpuIndex: GPU {index} is not one of the simulated GPUs "
                    f"({', '.join(str(k) for k in sorted(known))})"
                )


def _check_shared_gpu_budget(slots: list[SlotConfig], errors: list[str]) -> None:
    # Servers sharing a GPU each grab their fraction at start; together they must fit.
    claimed: dict[int, list[tuple[str, float]]] = {}
    for slot in slots:
        if isinstance(slot, InferenceSlotConfig):
            for m in slot.models:
                if m.profile and m.profile.gpu_memory_utilization is not None:
                    for index in m.profile.gpu_indices:
                        claimed.setdefault(index, []).append(
                            (m.name, m.profile.gpu_memory_utilization)
                        )
    for index, claims in sorted(claimed.items()):
        total = sum(f for _, f in claims)
        if len(claims) > 1 and total > 1.0 + 1e-9:
            who = ", ".join(f"{n} {f:g}" for n, f in claims)
            errors.append(
                f"slots: gpuMemoryUtilization of the servers sharing GPU {index} adds up to "
                f"{total:.2f} ({who}); it must not exceed 1.0"
            )


def servers_per_gpu(config: SupervisorConfig) -> Mapping[int, int]:
    """Count managed servers per GPU index, to split memory between servers sharing a card."""
    counts: dict[int, int] = {}
    for model in config.models:
        if model.profile:
            for index in model.profile.gpu_indices:
                counts[index] = counts.get(index, 0) + 1
    return counts


def validate_against_hardware(
    config: SupervisorConfig, facts: Mapping[int, GpuSpec], registry: EngineRegistry
) -> list[str]:
    """Re-check managed profiles with what the GPUs report (types, compute capability)."""
    errors: list[str] = []
    for model in config.models:
        if model.profile:
            adapter = registry.get(model.profile.engine)
            for problem in adapter.validate(model.profile, facts):
                errors.append(f"{model.path}.profile: {problem}")
    return errors


def _resolve(cwd: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (cwd / path)
