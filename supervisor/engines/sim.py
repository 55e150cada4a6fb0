"""The simulated engine (`python -m supervisor.sim`): speaks vLLM's control API, needs no GPU."""

from __future__ import annotations

import sys
from collections.abc import Mapping

from supervisor.engines.adapter import EngineAdapter, lora_args
from supervisor.engines.control import VllmControl
from supervisor.engines.launch import LaunchCommand, LaunchContext, finish, listen_args, problem
from supervisor.engines.lora import VllmLora
from supervisor.engines.profile import EngineProfile, GpuSpec


class SimAdapter(EngineAdapter):
    name = "sim"
    control = VllmControl()
    lora = VllmLora()
    needs_model_path = False
    owned_flags = ("--host", "--port", "--model", "--gpu-index")
    quantization_flags = ()

    def validate(self, profile: EngineProfile, facts: Mapping[int, GpuSpec]) -> list[str]:
        out = super().validate(profile, facts)
        if profile.nodes > 1:
            out.append(problem(profile, "the simulated engine runs on one node; nodes must be 1"))
        return out

    def build(self, profile: EngineProfile, ctx: LaunchContext) -> LaunchCommand:
        argv = [
            # The same interpreter as the supervisor: the simulator needs its dependencies.
            profile.executable or sys.executable,
            "-m",
            "supervisor.sim",
            *listen_args(ctx),
            "--model",
            profile.served_model_name,
            "--gpu-index",
            str(profile.gpu_indices[0]),
        ]
        # The same flags and variable as vLLM's (the simulator's CLI takes them).
        lora_argv, lora_env = lora_args(profile)
        argv += lora_argv
        argv += profile.extra_args
        return finish(profile, ctx, argv, lora_env)
