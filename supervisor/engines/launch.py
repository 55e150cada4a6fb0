"""What adapters share: the launch context and result, the environment rules, common checks."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from supervisor.child_env import inherited_env
from supervisor.engines.fingerprint import profile_fingerprint
from supervisor.engines.profile import EngineProfile, GpuSpec

# The bind address of every model server. Sleep and wake are unauthenticated dev endpoints;
# the supervisor's authenticated API is the only way in from outside the host.
LOOPBACK = "127.0.0.1"
# The flags vLLM and SGLang name a quantization by in extraArgs.
QUANTIZATION_FLAGS = ("--quantization", "-q")

# Lowest compute capability each quantization runs on, as (major, minor).
QUANTIZATION_MIN_CC: dict[str, tuple[int, int]] = {
    "fp8": (8, 9),
    "fbgemm_fp8": (8, 9),
    "modelopt": (8, 9),
    "nvfp4": (10, 0),
    "modelopt_fp4": (10, 0),
    "awq": (7, 5),
    "awq_marlin": (8, 0),
    "gptq_marlin": (8, 0),
    "marlin": (8, 0),
    "gptq": (6, 0),
}

# Share of a GPU the servers on it may claim together when none says how much it wants; the
# rest is headroom for CUDA contexts and the allocator.
SHARED_GPU_BUDGET = 0.9


@dataclass(frozen=True)
class LaunchContext:
    """What the host contributes to a launch beyond the profile."""

    port: int
    environ: Mapping[str, str]
    # How many managed servers share the busiest GPU this server runs on (itself included).
    servers_sharing_gpu: int = 1
    # Variables the supervisor adds (e.g. the simulated GPU state file); profile env still wins.
    host_env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LaunchCommand:
    """A fully resolved launch: argv to exec (no shell) and the complete environment."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    # Only what the adapter generated plus the profile's overrides, for logs and tests.
    generated_env: Mapping[str, str]
    fingerprint: str
    serves_http: bool

    def describe(self) -> str:
        """Render for a log line: argv with secrets masked, and variable names, never values."""
        return f"argv={redact_argv(self.argv)} env+={sorted(self.generated_env)}"


# A flag whose last word is one of these carries a credential (--api-key, --hf-token).
_SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd"})


def redact_argv(argv: Sequence[str]) -> list[str]:
    """Mask the value of any flag that looks like a credential (`--api-key x`, `--token=x`)."""
    out: list[str] = []
    mask_next = False
    for arg in argv:
        if mask_next:
            out.append("***")
            mask_next = False
            continue
        flag, eq, _ = arg.partition("=")
        last_word = re.split(r"[-_]", flag.lower().lstrip("-"))[-1]
        secret = arg.startswith("-") and last_word in _SECRET_WORDS
        if secret and eq:
            out.append(f"{flag}=***")
        else:
            out.append(arg)
            mask_next = secret
    return out


def build_env(
    profile: EngineProfile, ctx: LaunchContext, engine_env: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """Return (complete env, generated part) for a server.

    Layering, lowest first: the allowed part of the parent environment (engines need PATH,
    HOME, HF_HOME, LD_LIBRARY_PATH...: `supervisor/child_env.py`), the shared GPU and NCCL
    rules, the engine's own variables, what the host adds, and last the profile's overrides:
    the escape hatch for per-cluster tuning no adapter can guess.
    """
    generated: dict[str, str] = {}
    # CUDA numbers devices fastest-first by default; NVML and the config number them by PCI bus.
    generated["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    generated["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in profile.gpu_indices)
    generated.update(nccl_env(profile))
    generated.update(engine_env)
    generated.update(ctx.host_env)
    generated.update(profile.env)
    env = inherited_env(ctx.environ)
    env.update(generated)
    return env, generated


def nccl_env(profile: EngineProfile) -> dict[str, str]:
    """Return the NCCL/Gloo variables for the profile's network.

    - NCCL_IB_HCA lists only the chosen fabric's adapters: left unset, NCCL may pick an adapter
      on another fabric where the peer is unreachable, and the job hangs instead of failing.
    - NCCL_IB_DISABLE=1 without a fabric, so NCCL stops looking for one instead of timing out.
    - NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME pin bootstrap traffic to the management
      interface; otherwise NCCL probes every interface, including IPoIB ones that do not route.
    """
    env: dict[str, str] = {}
    if profile.fabric is not None:
        env["NCCL_IB_HCA"] = ",".join(profile.fabric.hcas)
        env["NCCL_IB_DISABLE"] = "0"
    else:
        env["NCCL_IB_DISABLE"] = "1"
    if profile.management_interface:
        env["NCCL_SOCKET_IFNAME"] = profile.management_interface
        env["GLOO_SOCKET_IFNAME"] = profile.management_interface
    return env


def memory_fraction(profile: EngineProfile, ctx: LaunchContext) -> float | None:
    """Return the GPU memory share to request, or None to leave the engine's default.

    An explicit profile value wins. Otherwise a server alone on its GPUs keeps the engine
    default, and servers sharing a GPU split the budget evenly, because each engine assumes
    it owns the card and the second one to start would fail to allocate.
    """
    if profile.gpu_memory_utilization is not None:
        return profile.gpu_memory_utilization
    if ctx.servers_sharing_gpu > 1:
        share = int(SHARED_GPU_BUDGET / ctx.servers_sharing_gpu * 100) / 100
        return max(share, 0.01)
    return None


def format_fraction(value: float) -> str:
    """Print a memory fraction without float noise (0.45, not 0.45000000000000001)."""
    return f"{value:.4f}".rstrip("0").rstrip(".")


def listen_args(ctx: LaunchContext) -> list[str]:
    """Bind the server to loopback on its own port: the flags every engine takes alike."""
    return ["--host", LOOPBACK, "--port", str(ctx.port)]


def tuning_args(profile: EngineProfile, ctx: LaunchContext, *, fraction_flag: str) -> list[str]:
    """The profile's quantization, then its memory fraction under the engine's own flag."""
    argv = ["--quantization", profile.quantization] if profile.quantization else []
    fraction = memory_fraction(profile, ctx)
    if fraction is not None:
        argv += [fraction_flag, format_fraction(fraction)]
    return argv


def finish(
    profile: EngineProfile, ctx: LaunchContext, argv: Sequence[str], engine_env: Mapping[str, str]
) -> LaunchCommand:
    """Assemble the LaunchCommand: environment, fingerprint, HTTP role."""
    env, generated = build_env(profile, ctx, engine_env)
    return LaunchCommand(
        argv=tuple(argv),
        env=env,
        generated_env=generated,
        fingerprint=profile_fingerprint(profile),
        serves_http=profile.is_leader,
    )


def problem(profile: EngineProfile, rule: str) -> str:
    """Word a validation failure so it names the profile and the rule."""
    return f'profile "{profile.name}" ({profile.engine}): {rule}'


def validate_common(
    profile: EngineProfile,
    facts: Mapping[int, GpuSpec],
    *,
    owned_flags: Iterable[str],
    needs_model_path: bool = True,
    quantization_flags: Iterable[str] = QUANTIZATION_FLAGS,
) -> list[str]:
    """Check the rules every engine shares; return the problems found."""
    out: list[str] = []
    if needs_model_path and not profile.model_path:
        out.append(problem(profile, "modelPath is required"))
    if not profile.gpus:
        out.append(problem(profile, "lists no GPUs"))
        return out
    per_node = profile.resolved_gpus_per_node
    if len(profile.gpus) != per_node:
        out.append(
            problem(
                profile,
                f"lists {len(profile.gpus)} GPUs on this node but gpusPerNode is {per_node}",
            )
        )
    want = profile.tensor_parallel * profile.pipeline_parallel
    have = profile.nodes * per_node
    if want != have:
        out.append(
            problem(
                profile,
                f"tensorParallel {profile.tensor_parallel} x pipelineParallel "
                f"{profile.pipeline_parallel} = {want} GPUs, but nodes {profile.nodes} x "
                f"gpusPerNode {per_node} = {have}; TP x PP must equal nodes x GPUs per node",
            )
        )
    out.extend(_multi_node_problems(profile))
    gpus = [g.merged_with(facts.get(g.index)) for g in profile.gpus]
    out.extend(_uniformity_problems(profile, gpus))
    quantization = quantization_of(profile, quantization_flags)
    if profile.quantization and _flag_value(profile.extra_args, quantization_flags):
        out.append(problem(profile, "sets quantization both as a field and in extraArgs"))
    if quantization:
        out.extend(_capability_problems(profile, gpus, quantization))
    for flag in owned_flags:
        if _flag_value(profile.extra_args, (flag,)) is not None or flag in profile.extra_args:
            out.append(problem(profile, f"extraArgs may not set {flag}; the supervisor sets it"))
    return out


def _multi_node_problems(profile: EngineProfile) -> list[str]:
    out: list[str] = []
    if profile.node_rank >= profile.nodes:
        out.append(
            problem(profile, f"nodeRank {profile.node_rank} is outside 0..{profile.nodes - 1}")
        )
    if profile.nodes > 1:
        if not profile.leader_addr or profile.leader_port is None:
            out.append(problem(profile, "a multi-node profile needs leaderAddr and leaderPort"))
        if not profile.management_interface:
            out.append(
                problem(
                    profile,
                    "a multi-node profile needs managementInterface for NCCL/Gloo bootstrap",
                )
            )
    return out


def _uniformity_problems(profile: EngineProfile, gpus: Sequence[GpuSpec]) -> list[str]:
    # A tensor-parallel group runs at the pace of its slowest card, and the smallest card decides
    # what fits; mixing types is never what the operator meant.
    types = {g.type for g in gpus if g.type}
    if len(types) > 1:
        listed = ", ".join(f"GPU {g.index} is {g.type}" for g in gpus if g.type)
        return [problem(profile, f"a tensor-parallel group may not mix GPU types ({listed})")]
    return []


def _capability_problems(
    profile: EngineProfile, gpus: Sequence[GpuSpec], quantization: str
) -> list[str]:
    need = QUANTIZATION_MIN_CC.get(quantization)
    if need is None:
        return []
    out: list[str] = []
    for g in gpus:
        have = parse_cc(g.compute_capability)
        # Unknown capability is let through: the engine refuses clearly enough, and blocking a
        # launch on a missing fact would be worse.
        if have is not None and have < need:
            out.append(
                problem(
                    profile,
                    f"quantization {quantization} needs compute capability "
                    f"{need[0]}.{need[1]} or newer, GPU {g.index}"
                    f"{f' ({g.type})' if g.type else ''} has {g.compute_capability}",
                )
            )
    return out


def parse_cc(value: str | None) -> tuple[int, int] | None:
    """Parse "8.9" into (8, 9); None when unknown or malformed."""
    if not value:
        return None
    major, _, minor = value.partition(".")
    if not major.isdigit() or not minor.isdigit():
        return None
    return int(major), int(minor)


def quantization_of(profile: EngineProfile, flags: Iterable[str]) -> str | None:
    """Return the quantization from the profile field, or from extraArgs."""
    if profile.quantization:
        return profile.quantization
    value = _flag_value(profile.extra_args, tuple(flags))
    return value.lower() if value else None


def _flag_value(args: Sequence[str], flags: Iterable[str]) -> str | None:
    flags = tuple(flags)
    for i, arg in enumerate(args):
        if arg in flags and i + 1 < len(args):
            return args[i + 1]
        for flag in flags:
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return None
