"""vLLM: `vllm serve` with sleep mode on, bound to loopback."""

from __future__ import annotations

from supervisor.engines.adapter import EngineAdapter, lora_args
from supervisor.engines.control import VllmControl
from supervisor.engines.launch import LaunchCommand, LaunchContext, finish, listen_args, tuning_args
from supervisor.engines.lora import VllmLora
from supervisor.engines.profile import EngineProfile

API_SERVER = "vllm.entrypoints.openai.api_server"


class VllmAdapter(EngineAdapter):
    name = "vllm"
    control = VllmControl()
    lora = VllmLora()
    owned_flags = (
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
        "--enable-sleep-mode",
        "--model",
    )

    def build(self, profile: EngineProfile, ctx: LaunchContext) -> LaunchCommand:
        if profile.entrypoint == "api-server":
            start = [profile.executable or "python3", "-m", API_SERVER, "--model"]
        else:
            start = [profile.executable or "vllm", "serve"]
        argv = [
            *start,
            profile.model_path or "",
            "--served-model-name",
            profile.served_model_name,
            *listen_args(ctx),
        ]
        if profile.sleep_mode == "native":
            # Sleep mode is what makes a standby cost no idle GPU. A platform without it (CPU)
            # refuses the flag and exits; "api-only" leaves it out and keeps the dev endpoints.
            argv.append("--enable-sleep-mode")
        argv += [
            "--tensor-parallel-size",
            str(profile.tensor_parallel),
            "--pipeline-parallel-size",
            str(profile.pipeline_parallel),
        ]
        argv += tuning_args(profile, ctx, fraction_flag="--gpu-memory-utilization")
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
        lora_argv, lora_env = lora_args(profile)
        argv += lora_argv
        argv += profile.extra_args
        # The sleep/wake endpoints exist only in dev mode; they stay on loopback.
        return finish(profile, ctx, argv, {"VLLM_SERVER_DEV_MODE": "1", **lora_env})
