"""The contract every engine adapter implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

from supervisor.engines.control import ServerControl
from supervisor.engines.launch import (
    QUANTIZATION_FLAGS,
    LaunchCommand,
    LaunchContext,
    problem,
    validate_common,
)
from supervisor.engines.lora import VllmLora
from supervisor.engines.profile import EngineProfile, GpuSpec

# The flags and variable that turn on runtime LoRA loading (vLLM 0.32's names; the simulated
# engine takes the same). The supervisor sets them from the profile's `lora`.
LORA_FLAGS = ("--enable-lora", "--max-loras", "--max-lora-rank")
LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


class EngineAdapter(ABC):
    """Build one engine's launch and say how to sleep and wake it."""

    name: str
    control: ServerControl
    health_path: str = "/health"
    # Whether `validate` insists on modelPath (the simulated engine loads nothing).
    needs_model_path: bool = True
    # The flags the supervisor sets itself; extraArgs may not repeat them.
    owned_flags: tuple[str, ...] = ()
    # The flags that name a quantization in extraArgs; none where the engine takes none.
    quantization_flags: tuple[str, ...] = QUANTIZATION_FLAGS
    # Runtime LoRA loading (supervisor/engines/lora.py); None: the engine cannot.
    lora: VllmLora | None = None

    def validate(self, profile: EngineProfile, facts: Mapping[int, GpuSpec]) -> list[str]:
        """Return every reason this profile cannot run on these GPUs; empty when it can.

        The rules every engine shares; an engine with rules of its own extends this.
        """
        out = validate_common(
            profile,
            facts,
            owned_flags=(*self.owned_flags, *(LORA_FLAGS if self.lora is not None else ())),
            needs_model_path=self.needs_model_path,
            quantization_flags=self.quantization_flags,
        )
        if profile.lora is not None and self.lora is None:
            out.append(
                problem(profile, f"{self.name} cannot load LoRA adapters at runtime; drop lora")
            )
        return out

    @abstractmethod
    def build(self, profile: EngineProfile, ctx: LaunchContext) -> LaunchCommand:
        """Return the exact argv and complete environment; start nothing."""

    def serves_http(self, profile: EngineProfile) -> bool:
        """Report whether this rank answers HTTP; in a multi-node group only the leader does."""
        return profile.is_leader


def lora_args(profile: EngineProfile) -> tuple[list[str], dict[str, str]]:
    """The flags and environment of the profile's runtime LoRA loading (none without `lora`)."""
    if profile.lora is None:
        return [], {}
    argv = [
        "--enable-lora",
        "--max-loras",
        str(profile.lora.max_loras),
        "--max-lora-rank",
        str(profile.lora.max_rank),
    ]
    return argv, dict(LORA_ENV)
