"""SGLang: `python -m sglang.launch_server` with the memory saver, bound to loopback."""

from __future__ import annotations

from collections.abc import Mapping

from supervisor.engines.adapter import EngineAdapter
from supervisor.engines.control import SglangControl
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
    "--model-path",
    "--tp-size",
    "--tp",
    "--pp-size",
    "--nnodes",
    "--node-rank",
    "--dist-init-addr",
    "--mem-fraction-static",
)


class SglangAdapter(EngineAdapter):
    name = "sglang"
    control = SglangControl()

    def validate(self, profile: EngineProfile, facts: Mapping[int, GpuSpec]) -> list[str]:
        return validate_common(profile, facts, owned_flags=OWNED_FLAGS)

    def build(self, profile: EngineProfile, ctx: LaunchContext) -> LaunchCommand:
        argv = [
            profile.executable or "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            profile.model_path or "",
            "--served-model-name",
            profile.served_model_name,
            "--host",
            LOOPBACK,
            "--port",
            str(ctx.port),
            "--tp-size",
            str(profile.tensor_parallel),
            "--pp-size",
            str(profile.pipeline_parallel),
            # Without the memory saver, release/resume_memory_occupation are refused.
            "--enable-memory-saver",
        ]
        if profile.quantization:
            argv += ["--quantization", profile.quantization]
        fraction = memory_fraction(profile, ctx)
        if fraction is not None:
            argv += ["--mem-fraction-static", format_fraction(fraction)]
        if profile.nodes > 1:
            argv += [
                "--nnodes",
                str(profile.nodes),
                "--node-rank",
                str(profile.node_rank),
                "--dist-init-addr",
                f"{profile.leader_addr}:{profile.leader_port}",
            ]
        argv += profile.extra_args
        return finish(profile, ctx, argv, {})
