"""The simulated engine (`python -m supervisor.sim`): speaks vLLM's control API, needs no GPU."""

from __future__ import annotations

import sys
from collections.abc import Mapping

from supervisor.engines.adapter import EngineAdapter
from supervisor.engines.control import VllmControl
from supervisor.engines.launch import LOOPBACK, LaunchCommand, LaunchContext, finish, problem
from supervisor.engines.launch import validate_common as _validate_common
from supervisor.engines.profile import EngineProfile, GpuSpec

OWNED_FLAGS = ("--host", "--port", "--model", "--gpu-index")


class SimAdapter(EngineAdapter):
    name = "sim"
    control = VllmControl()
    needs_model_path = False

    def validate(self, profile: EngineProfile, facts: Mapping[int, GpuSpec]) -> list[str]:
        out = _validate_common(
            profile, facts, owned_flags=OWNED_FLAGS, needs_model_path=False, quantization_flags=()
        )
        if profile.nodes > 1:
            out.append(problem(profile, "the simulated engine runs on one node; nodes must be 1"))
        return out

    def build(self, profile: EngineProfile, ctx: LaunchContext) -> LaunchCommand:
        argv = [
            # The same interpreter as the supervisor: the simulator needs its dependencies.
            profile.executable or sys.executable,
            "-m",
            "supervisor.sim",
            "--host",
            LOOPBACK,
            "--port",
            str(ctx.port),
            "--model",
            profile.served_model_name,
            "--gpu-index",
            str(profile.gpu_indices[0]),
        ]
        argv += profile.extra_args
        return finish(profile, ctx, argv, {})
