"""vLLM: `vllm serve` with sleep mode on, bound to loopback."""

from __future__ import annotations

from collections.abc import Mapping

from supervisor.engines.adapter import EngineAdapter
from supervisor.engines.control import VllmControl
from supervisor.engines.launch import (
    LOOPBACK,
    LaunchCommand,
    LaunchContext,
    finish,
    format_fraction,
    memory_fraction,
    validate_common,
)
from supervisor.engines.profile import EngineProfile, GpuSpec

OWNED_FLAGS = (
    "--host",
    "--port",
    "--served-model-name",
    "--tensor-parallel-size",
    "-tp",
    "--pipeline-parallel-size",
    "-pp",
    "--nnodes",
    "--node-rank",
    "--master-addr",
    "--master-port",
    "--headless",
    "--gpu-memory-utilization",
)


class VllmAdapter(EngineAdapter):
    name = "vllm"
    control = VllmControl()

    def validate(self, profile: EngineProfile, facts: Mapping[int, GpuSpec]) -> list[str]:
        return validate_common(profile, facts, owned_flags=OWNED_FLAGS)

    def build(self, profile: EngineProfile, ctx: LaunchContext) -> LaunchCommand:
        argv = [
            profile.executable or "vllm",
            "serve",
            profile.model_path or "",
            "--served-model-name",
            profile.served_model_name,
            "--host",
            LOOPBACK,
            "--port",
            str(ctx.port),
            # Sleep mode is what makes a standby cost no idle GPU; without it /sleep is a 404.
            "--enable-sleep-mode",
            "--tensor-parallel-size",
            str(profile.tensor_parallel),
            "--pipeline-parallel-size",
            str(profile.pipeline_parallel),
        ]
        if profile.quantization:
            argv += ["--quantization", profile.quantization]
        fraction = memory_fraction(profile, ctx)
        if fraction is not None:
            argv += ["--gpu-memory-utilization", format_fraction(fraction)]
        if profile.nodes > 1:
            # Multi-node without Ray: every rank runs the same command with its rank, and only
            # rank 0 serves the API; the others run headless.
            argv += [
                "--distributed-executor-backend",
                "mp",
                "--nnodes",
                str(profile.nodes),
                "--node-rank",
                str(profile.node_rank),
                "--master-addr",
                profile.leader_addr or "",
                "--master-port",
                str(profile.leader_port),
            ]
            if not profile.is_leader:
                argv.append("--headless")
        argv += profile.extra_args
        # The sleep/wake endpoints exist only in dev mode; they stay on loopback.
        return finish(profile, ctx, argv, {"VLLM_SERVER_DEV_MODE": "1"})
