"""SGLang: `python -m sglang.launch_server` with the memory saver, bound to loopback."""

from __future__ import annotations

from supervisor.engines.adapter import EngineAdapter
from supervisor.engines.control import SglangControl
from supervisor.engines.launch import LaunchCommand, LaunchContext, finish, listen_args, tuning_args
from supervisor.engines.profile import EngineProfile


class SglangAdapter(EngineAdapter):
    name = "sglang"
    control = SglangControl()
    owned_flags = (
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

    def build(self, profile: EngineProfile, ctx: LaunchContext) -> LaunchCommand:
        argv = [
            profile.executable or "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            profile.model_path or "",
            "--served-model-name",
            profile.served_model_name,
            *listen_args(ctx),
            "--tp-size",
            str(profile.tensor_parallel),
            "--pp-size",
            str(profile.pipeline_parallel),
            # Without the memory saver, release/resume_memory_occupation are refused.
            "--enable-memory-saver",
        ]
        argv += tuning_args(profile, ctx, fraction_flag="--mem-fraction-static")
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
