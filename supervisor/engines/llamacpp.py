"""llama.cpp: `llama-server` on one node; it cannot sleep, so standby stops it."""

from __future__ import annotations

from collections.abc import Mapping

from supervisor.engines.adapter import EngineAdapter
from supervisor.engines.control import StopControl
from supervisor.engines.launch import LaunchCommand, LaunchContext, finish, listen_args, problem
from supervisor.engines.profile import EngineProfile, GpuSpec

# Offload every layer: a partial offload would leave the model on the CPU without saying so.
ALL_LAYERS = "999"


class LlamaCppAdapter(EngineAdapter):
    name = "llamacpp"
    control = StopControl()
    owned_flags = ("--host", "--port", "--alias", "--model", "-m", "--split-mode", "-sm")
    quantization_flags = ()

    def validate(self, profile: EngineProfile, facts: Mapping[int, GpuSpec]) -> list[str]:
        out = super().validate(profile, facts)
        if profile.nodes > 1:
            out.append(problem(profile, "llama.cpp runs on one node; nodes must be 1"))
        if profile.tensor_parallel > 1 and profile.pipeline_parallel > 1:
            out.append(
                problem(
                    profile,
                    "llama.cpp splits a model by rows (TP) or by layers (PP), not both",
                )
            )
        if profile.quantization:
            out.append(
                problem(profile, "llama.cpp takes its quantization from the GGUF file; drop it")
            )
        if profile.gpu_memory_utilization is not None:
            out.append(
                problem(profile, "llama.cpp has no memory fraction; drop gpuMemoryUtilization")
            )
        return out

    def build(self, profile: EngineProfile, ctx: LaunchContext) -> LaunchCommand:
        argv = [
            profile.executable or "llama-server",
            "--model",
            profile.model_path or "",
            "--alias",
            profile.served_model_name,
            *listen_args(ctx),
            "--n-gpu-layers",
            ALL_LAYERS,
        ]
        if profile.tensor_parallel > 1:
            argv += ["--split-mode", "row"]
        elif profile.pipeline_parallel > 1:
            argv += ["--split-mode", "layer"]
        argv += profile.extra_args
        return finish(profile, ctx, argv, {})
