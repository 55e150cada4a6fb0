"""The contract every engine adapter implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

from supervisor.engines.control import ServerControl
from supervisor.engines.launch import (
    QUANTIZATION_FLAGS,
    LaunchCommand,
    LaunchContext,
    validate_common,
)
from supervisor.engines.profile import EngineProfile, GpuSpec


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

    def validate(self, profile: EngineProfile, facts: Mapping[int, GpuSpec]) -> list[str]:
        """Return every reason this profile cannot run on these GPUs; empty when it can.

        The rules every engine shares; an engine with rules of its own extends this.
        """
        return validate_common(
            profile,
            facts,
            owned_flags=self.owned_flags,
            needs_model_path=self.needs_model_path,
            quantization_flags=self.quantization_flags,
        )

    @abstractmethod
    def build(self, profile: EngineProfile, ctx: LaunchContext) -> LaunchCommand:
        """Return the exact argv and complete environment; start nothing."""

    def serves_http(self, profile: EngineProfile) -> bool:
        """Report whether this rank answers HTTP; in a multi-node group only the leader does."""
        return profile.is_leader
