"""The registry of engine adapters, by name."""

from __future__ import annotations

from supervisor.engines.adapter import EngineAdapter
from supervisor.engines.llamacpp import LlamaCppAdapter
from supervisor.engines.sglang import SglangAdapter
from supervisor.engines.sim import SimAdapter
from supervisor.engines.vllm import VllmAdapter


class UnknownEngine(KeyError):
    """No adapter is registered under that name."""


class EngineRegistry:
    """Hold adapters by name; a later `add` replaces an earlier one of the same name."""

    def __init__(self, adapters: list[EngineAdapter] | None = None) -> None:
        self._adapters: dict[str, EngineAdapter] = {}
        for adapter in adapters or []:
            self.add(adapter)

    def add(self, adapter: EngineAdapter) -> None:
        self._adapters[adapter.name] = adapter

    def get(self, name: str) -> EngineAdapter:
        try:
            return self._adapters[name]
        except KeyError:
            raise UnknownEngine(
                f'unknown engine "{name}" (known: {", ".join(self.names())})'
            ) from None

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._adapters))


def default_registry() -> EngineRegistry:
    """Return a registry with the built-in engines."""
    return EngineRegistry([VllmAdapter(), SglangAdapter(), LlamaCppAdapter(), SimAdapter()])
