"""What a simulated engine is told (its options) and what it keeps (faults, counters): plain data
that both the engine (engine.py) and its inference routes (inference.py) read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FAULT_NAMES = {
    "wakeFails": "wake_fails",
    "wakeHangs": "wake_hangs",
    "sleepFails": "sleep_fails",
    "inference5xx": "inference_5xx",
    "isSleepingGarbage": "is_sleeping_garbage",
    "crash": "crash",
    # The failures a golden probe exists to catch (vLLM issue 53888): a wake after which the
    # model answers differently, or after which its LoRA adapters silently stop applying.
    # Each takes effect at the next wake and lasts until the engine is reset.
    "answerDriftsAfterWake": "answer_drifts_after_wake",
    "adaptersLostAfterWake": "adapters_lost_after_wake",
    # A model that answers wrongly from now on (no wake needed): a bad version mid-rollout, whose
    # answer checks must fail before any more users are sent to it. Cleared with the others.
    "answerWrong": "answer_wrong",
    # A runtime LoRA load (`/v1/load_lora_adapter`) made while this is on reports success and is
    # listed by /v1/models, but requests for it answer as the base model: "loaded but serving
    # nothing". It marks the adapters loaded meanwhile; clearing it does not heal them (a
    # reload does, as does a reset).
    "adapterNoop": "adapter_noop",
}


@dataclass
class SimOptions:
    model: str
    port: int
    host: str = "127.0.0.1"
    weights_mib: int = 0
    context_mib: int = 0
    gpu_index: int = 0
    sim_state: str | None = None
    wake_latency_ms: int = 0
    sleep_latency_ms: int = 0
    ttft_ms: int = 0
    token_delay_ms: int = 0
    load_ms: int = 0
    reply: str | None = None
    echo: bool = False
    # Answer with text generated from the prompt's token ids (generate.py) instead of `reply`:
    # as long as max_tokens asks, and continuable on another engine from the ids so far.
    generate: bool = False
    # With `generate`: the chance (per thousand word boundaries) of ending with the EOS id.
    eos_per_mille: int = 0
    # With `generate`: vLLM's quirk of re-sending the prompt's text when it ends mid-character.
    reemit_split_prompt: bool = False
    # As vLLM's --lora-modules NAME=PATH: extra served names, each answering in its own way.
    lora_modules: tuple[str, ...] = ()
    # vLLM's runtime LoRA options: /v1/load_lora_adapter exists only with
    # VLLM_ALLOW_RUNTIME_LORA_UPDATING (`runtime_lora_updating`), and loads only with
    # --enable-lora; a rank over --max-lora-rank is refused; --max-cpu-loras (default
    # --max-loras) adapters stay cached, the least recently used beyond that evicted and read
    # again from their path when next asked for.
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    runtime_lora_updating: bool = False
    start_asleep: bool = False
    max_model_len: int = 4096
    server_load_tracking: bool = False
    # Like vLLM's --api-key: inference routes need `Authorization: Bearer <key>`.
    api_key: str | None = None
    backend: str = "sim"
    # The torch backend's own settings (device, KV cache, weights file); empty for "sim".
    backend_settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class Faults:
    wake_fails: bool = False
    wake_hangs: bool = False
    sleep_fails: bool = False
    inference_5xx: bool = False
    is_sleeping_garbage: bool = False
    crash: bool = False
    answer_drifts_after_wake: bool = False
    adapters_lost_after_wake: bool = False
    answer_wrong: bool = False
    adapter_noop: bool = False

    def to_json(self) -> dict[str, bool]:
        return {wire: getattr(self, attr) for wire, attr in FAULT_NAMES.items()}


@dataclass
class Stats:
    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    rejected: int = 0
    inflight: int = 0
    sleeps: int = 0
    wakes: int = 0
