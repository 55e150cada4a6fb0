"""The host's config (`HARU_SUPERVISOR_CONFIG`): slots, models, trainers and the GPU backend.

Parsing is strict: unknown fields are refused and every error names its JSON path and rule,
because a supervisor that starts with a half-understood config is worse than one that refuses.
Relative paths (checkpoint dirs, the simulated GPU state file, the state dir) resolve against the
working directory the supervisor was started in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.engines.profile import EngineProfile, GpuSpec, parse_profile
from supervisor.engines.registry import EngineRegistry, default_registry
from supervisor.limits import MAX_MS
from supervisor.secrets import SecretRef
from supervisor.strict_json import MISSING, ConfigError, ObjectReader, child_path

DEFAULT_GRACE_MS = 30_000
DEFAULT_DRAIN_BUDGET_MS = 30_000
DEFAULT_SIM_GPU = {"index": 0, "totalMiB": 81920, "name": "SIM-H100", "computeCapability": "9.0"}
# Engines an unmanaged server may be: each has an HTTP sleep protocol. llama.cpp has none, so
# the supervisor can only put it on standby by stopping a process it started itself.
UNMANAGED_ENGINES = ("vllm", "sglang", "sim")
_HOST_LABEL = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


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
    try:
        return json.loads(text), origin
    except json.JSONDecodeError as exc:
        raise ConfigError(
            [f"(root): {origin} is not valid JSON: {exc.msg} at line {exc.lineno}"]
        ) from exc


def load_config(
    source: str, *, cwd: Path, registry: EngineRegistry | None = None
) -> SupervisorConfig:
    """Read and validate a config from inline JSON or a file path; raise ConfigError."""
    data, _ = read_config_source(source, cwd)
    return parse_config(data, cwd=cwd, registry=registry)


def parse_config(
    data: Any, *, cwd: Path, registry: EngineRegistry | None = None
) -> SupervisorConfig:
    """Validate a parsed config document; raise ConfigError listing every problem."""
    registry = registry or default_registry()
    errors: list[str] = []
    root = ObjectReader(data, "", errors)
    if not root.ok:
        raise ConfigError(errors)
    host = root.str("host")
    if host is not None and not _HOST_LABEL.match(host):
        root.error("host", "must be lowercase letters, digits and single hyphens")
    state_dir = root.str("stateDir")
    if state_dir is not None and not state_dir.strip():
        root.error("stateDir", "must not be empty")
        state_dir = None
    drain_budget_ms = root.int(
        "drainBudgetMs", default=DEFAULT_DRAIN_BUDGET_MS, minimum=0, maximum=MAX_MS
    )
    gpu = _parse_gpu(root.raw("gpu"), "gpu", errors, cwd)
    slots = _parse_slots(root.raw("slots", required=True), errors, cwd, registry)
    plan = _parse_plan(root.raw("plan"), errors)
    root.finish()
    if not errors:
        _check_cross_slot_rules(slots, gpu, errors, registry)
    if errors:
        raise ConfigError(errors)
    return SupervisorConfig(
        slots=tuple(slots),
        gpu=gpu,
        host=host,
        state_dir=_resolve(cwd, state_dir) if state_dir else None,
        drain_budget_ms=DEFAULT_DRAIN_BUDGET_MS if drain_budget_ms is None else drain_budget_ms,
        plan=plan,
    )


def _parse_plan(raw: Any, errors: list[str]) -> PlanConfig:
    if raw is MISSING:
        return PlanConfig()
    r = ObjectReader(raw, "plan", errors)
    if not r.ok:
        return PlanConfig()
    margin = r.int("safetyMarginMiB", default=0, minimum=0)
    gpus_raw = r.list("gpus", required=True)
    r.finish()
    gpus: list[PlannedGpu] = []
    for i, item in enumerate(gpus_raw or []):
        g = ObjectReader(item, child_path(r.field_path("gpus"), i), errors)
        if not g.ok:
            continue
        index = g.int("index", required=True, minimum=0, maximum=1023)
        gpu_type = g.str("type", required=True)
        memory = g.int("memoryMiB", required=True, minimum=1)
        g.finish()
        if index is not None and gpu_type is not None and memory is not None:
            gpus.append(PlannedGpu(index, gpu_type, memory))
    return PlanConfig(gpus=tuple(gpus), safety_margin_mib=margin or 0)


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


def _parse_gpu(raw: Any, path: str, errors: list[str], cwd: Path) -> GpuConfig:
    if raw is MISSING:
        return GpuConfig(backend="nvml")
    r = ObjectReader(raw, path, errors)
    if not r.ok:
        return GpuConfig(backend="nvml")
    backend = r.str("backend", default="nvml")
    if backend not in ("nvml", "sim"):
        r.error("backend", f'must be "nvml" or "sim", got "{backend}"')
        backend = "nvml"
    state_file = r.str("simStateFile")
    gpus_raw = r.raw("simGpus")
    r.finish()
    if backend == "nvml":
        if state_file is not None:
            r.error("simStateFile", 'is only for backend "sim"')
        if gpus_raw is not MISSING:
            r.error("simGpus", 'is only for backend "sim"')
        return GpuConfig(backend="nvml")
    if state_file is None:
        r.error("simStateFile", 'is required for backend "sim"')
    sim_gpus = _parse_sim_gpus(
        [DEFAULT_SIM_GPU] if gpus_raw is MISSING else gpus_raw, r.field_path("simGpus"), errors
    )
    return GpuConfig(
        backend="sim",
        sim_state_file=_resolve(cwd, state_file) if state_file else None,
        sim_gpus=sim_gpus,
    )


def _parse_sim_gpus(raw: Any, path: str, errors: list[str]) -> tuple[SimGpuConfig, ...]:
    if not isinstance(raw, list) or not raw:
        errors.append(f"{path}: must be a non-empty list")
        return ()
    out: list[SimGpuConfig] = []
    seen: dict[int, str] = {}
    for i, item in enumerate(raw):
        p = child_path(path, i)
        g = ObjectReader(item, p, errors)
        if not g.ok:
            continue
        index = g.int("index", required=True, minimum=0, maximum=1023)
        total = g.int("totalMiB", required=True, minimum=1)
        name = g.str("name", default="SIM-GPU")
        cc = g.str("computeCapability", default="9.0")
        uuid = g.str("uuid")
        g.finish()
        if cc is not None and not re.match(r"^\d+\.\d+$", cc):
            g.error("computeCapability", f'must look like "8.9", got "{cc}"')
        if index is None or total is None:
            continue
        if index in seen:
            g.error("index", f"GPU {index} is already declared at {seen[index]}")
            continue
        seen[index] = p
        out.append(SimGpuConfig(index, total, name or "SIM-GPU", cc or "9.0", uuid))
    return tuple(out)


def _parse_slots(
    raw: Any, errors: list[str], cwd: Path, registry: EngineRegistry
) -> list[SlotConfig]:
    if raw is MISSING:
        return []
    if not isinstance(raw, list) or not raw:
        errors.append("slots: must be a non-empty list of slots")
        return []
    slots: list[SlotConfig] = []
    seen_slot: dict[tuple[int, str], str] = {}
    for i, item in enumerate(raw):
        path = child_path("slots", i)
        r = ObjectReader(item, path, errors)
        if not r.ok:
            continue
        kind = r.str("kind", required=True)
        gpu_index = r.int("gpuIndex", required=True, minimum=0, maximum=1023)
        slot: SlotConfig | None = None
        if kind == "inference":
            slot = _parse_inference(r, gpu_index, registry, cwd)
        elif kind == "training":
            slot = _parse_training(r, gpu_index, cwd)
        else:
            if kind is not None:
                r.error("kind", f'must be "inference" or "training", got "{kind}"')
            r.raw("models")
            r.raw("command")
            r.raw("checkpointDir")
            r.raw("graceMs")
        r.finish()
        if slot is None or gpu_index is None:
            continue
        key = (gpu_index, slot.kind)
        if key in seen_slot:
            # The control plane addresses slots by (GPU, kind); two would be indistinguishable.
            r.error(
                "",
                f"a {slot.kind} slot on GPU {gpu_index} is already declared at {seen_slot[key]};"
                " (gpuIndex, kind) must be unique",
            )
            continue
        seen_slot[key] = path
        slots.append(slot)
    return slots


def _parse_inference(
    r: ObjectReader, gpu_index: int | None, registry: EngineRegistry, cwd: Path
) -> InferenceSlotConfig | None:
    raw_models = r.list("models", required=True)
    if raw_models is None:
        return None
    if not raw_models:
        r.error("models", "must list at least one model")
        return None
    models: list[ModelConfig] = []
    for j, item in enumerate(raw_models):
        model = _parse_model(
            item, child_path(r.field_path("models"), j), r.errors, gpu_index, registry, cwd
        )
        if model is not None:
            models.append(model)
    if gpu_index is None or len(models) != len(raw_models):
        return None
    return InferenceSlotConfig(gpu_index=gpu_index, models=tuple(models))


def _parse_model(
    raw: Any,
    path: str,
    errors: list[str],
    gpu_index: int | None,
    registry: EngineRegistry,
    cwd: Path,
) -> ModelConfig | None:
    before = len(errors)
    m = ObjectReader(raw, path, errors)
    if not m.ok:
        return None
    name = m.str("name", required=True)
    if name is not None:
        if name != name.lower():
            # Routing keys are lowercase and matched exactly; "Qwen" would never be routed to.
            m.error("name", "must be lowercase")
        elif any(c.isspace() for c in name):
            m.error("name", "must not contain whitespace")
        elif len(name) > 128:
            m.error("name", "must be at most 128 characters")
    port = m.int("port", required=True, minimum=1, maximum=65535)
    memory_mib = m.int("memoryMiB", minimum=1)
    residue_mib = m.int("sleepResidueMiB", minimum=0)
    engine = m.str("engine")
    profile_raw = m.raw("profile")
    api_key = _parse_secret_ref(m.raw("apiKey"), m.field_path("apiKey"), errors, cwd)
    m.finish()
    profile = None
    if profile_raw is not MISSING and profile_raw is not None and name is not None:
        profile = parse_profile(
            profile_raw,
            m.field_path("profile"),
            errors,
            model_name=name,
            default_gpu_index=gpu_index if gpu_index is not None else 0,
            engine_names=registry.names(),
        )
        if profile is not None:
            if engine is not None and engine != profile.engine:
                m.error("engine", f'is "{engine}" but the profile says "{profile.engine}"')
            if gpu_index is not None and gpu_index not in profile.gpu_indices:
                m.error(
                    "profile",
                    f"runs on GPUs {list(profile.gpu_indices)}, which do not include the "
                    f"slot's GPU {gpu_index}",
                )
            for problem in registry.get(profile.engine).validate(profile, {}):
                m.error("profile", problem)
    elif engine is not None and engine not in UNMANAGED_ENGINES:
        if engine in registry.names():
            m.error(
                "engine",
                f'"{engine}" cannot sleep over HTTP; give the model a profile so the supervisor '
                "can stop and start it",
            )
        else:
            m.error("engine", f'unknown engine "{engine}" (known: {", ".join(registry.names())})')
    if len(errors) > before or name is None or port is None:
        return None
    return ModelConfig(
        name=name,
        port=port,
        gpu_index=gpu_index if gpu_index is not None else 0,
        engine=profile.engine if profile else (engine or "vllm"),
        profile=profile,
        path=path,
        api_key=api_key,
        memory_mib=memory_mib,
        sleep_residue_mib=residue_mib,
    )


def _parse_secret_ref(raw: Any, path: str, errors: list[str], cwd: Path) -> SecretRef | None:
    """`{"env": NAME}` or `{"file": PATH}`: a key by reference, never the key itself."""
    if raw is MISSING or raw is None:
        return None
    r = ObjectReader(raw, path, errors)
    if not r.ok:
        return None
    env = r.str("env")
    file = r.str("file")
    r.finish()
    if (env is None) == (file is None):
        r.error("", 'must name exactly one of "env" (a variable) or "file" (a path)')
        return None
    if env is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", env):
        r.error("env", "must be an environment variable name")
        return None
    return SecretRef(env=env, file=_resolve(cwd, file) if file else None)


def _parse_training(r: ObjectReader, gpu_index: int | None, cwd: Path) -> TrainingSlotConfig | None:
    command = r.str_list("command", required=True)
    if command is not None and not command:
        r.error("command", "must not be empty")
        command = None
    checkpoint_dir = r.str("checkpointDir", required=True)
    grace_ms = r.int("graceMs", default=DEFAULT_GRACE_MS, minimum=1, maximum=MAX_MS)
    limit = r.int("memoryLimitMiB", minimum=1)
    if command is None or checkpoint_dir is None or gpu_index is None:
        return None
    return TrainingSlotConfig(
        gpu_index=gpu_index,
        command=tuple(command),
        checkpoint_dir=_resolve(cwd, checkpoint_dir),
        grace_ms=grace_ms or DEFAULT_GRACE_MS,
        memory_limit_mib=limit,
    )


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
