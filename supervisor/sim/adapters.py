"""LoRA adapters as the simulated engine serves them, and as the simulated trainer records them.

The heart of the "loaded but serving nothing" defence is that a trainer's manifest records the
answers an engine gives once the adapter is applied, and the base model's answers, so a probe
can tell the two apart. For the simulator both sides call the functions here: the trainer
(`supervisor.sim.trainer --adapter-name`) to write `eval` in the manifest, the engine
(`supervisor.sim.engine`) to answer a request naming a loaded adapter. The engine therefore
reproduces the trainer's record exactly, by construction, unless a fault says otherwise.

An adapter's answer is a function of its weights file's sha256 and the prompt only (never of
the process, the engine's options or the load order): two engines that loaded the same bytes
agree, and an adapter whose weights changed by one bit answers differently.

A deliberately bad version (for the demo's rollback) carries `"haru_sim": {"errorRate": R,
"latencyMs": MS}` in its adapter_config.json: its eval answers still match (it registers and
passes its first probe), but the engine then fails a share R of the requests for it with a
500 and delays each by MS, which is what runtime gates exist to catch.

Standard library only: the simulated trainer imports it.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.sim import tokens

CONFIG_NAME = "adapter_config.json"
# The weight files vLLM looks for, in its order (vllm/lora/lora_model.py).
WEIGHT_NAMES = ("adapter_model.safetensors", "adapter_model.bin", "adapter_model.pt")
SIM_KEY = "haru_sim"
# Bounds: a config is read from a directory another process wrote.
MAX_CONFIG_BYTES = 64 * 1024
MAX_LATENCY_MS = 600_000
# How many words an adapter's answer has: more than any eval asks of it in practice, so the
# answer usually ends by max_tokens ("length"); fewer asked and it ends with "stop".
ANSWER_WORDS = 64
DEFAULT_MAX_TOKENS = 16

# What an adapter says: lower-case words, each one scripted step (one "token").
_ADAPTER_TEXT = (
    "tuned adapter answers with its own words learned on the standby while the active "
    "served users and every version differs from the base model in what it says next "
    "support ticket refund order shipping invoice account password reset billing plan "
    "upgrade cancel help agent queue priority urgent resolved pending escalate follow"
)
_ADAPTER_WORDS = _ADAPTER_TEXT.split()


class AdapterNotFound(Exception):
    """No adapter at the path (vLLM's LoRAAdapterNotFoundError: the engine answers 404)."""


class AdapterInvalid(ValueError):
    """An adapter the engine refuses to load; the message is vLLM's where it has one."""


@dataclass(frozen=True)
class SimBehaviour:
    """How the engine misbehaves for a deliberately bad adapter (nothing, for a good one)."""

    error_rate: float = 0.0
    latency_ms: int = 0

    def fails(self, served: int) -> bool:
        """Whether request number `served` (0-based) fails: exactly a share `error_rate` of
        them, spread evenly and deterministically; the first one always succeeds, so the
        version passes its first probe and is caught by its runtime error rate."""
        rate = self.error_rate
        return math.floor((served + 1) * rate) - math.floor(served * rate) > 0


@dataclass(frozen=True)
class AdapterFacts:
    """What the engine read from an adapter directory when it loaded it."""

    path: str
    rank: int
    target_modules: tuple[str, ...]
    base_model: str | None
    weights_sha256: str
    behaviour: SimBehaviour


def base_reply(model: str) -> str:
    """The simulated engine's default answer for its base model (no `--reply`)."""
    return f"Hello from {model}, a simulated model server."


def adapter_reply(weights_sha256: str, prompt: str) -> str:
    """The whole answer an applied adapter gives to `prompt`: ANSWER_WORDS words chosen by a
    hash of the weights' sha256 and the prompt."""
    words: list[str] = []
    seed = hashlib.sha256(f"{weights_sha256}\0{prompt}".encode()).digest()
    block = b""
    i = 0
    while len(words) < ANSWER_WORDS:
        if not block:
            block = hashlib.sha256(seed + i.to_bytes(4, "big")).digest()
            i += 1
        words.append(_ADAPTER_WORDS[block[0] % len(_ADAPTER_WORDS)])
        block = block[1:]
    return " ".join(words)


def scripted_answer(reply: str, max_tokens: int | None) -> str:
    """The text the engine sends for a scripted reply under `max_tokens`: one word a token
    (supervisor/sim/replies.py's plan_completion), DEFAULT_MAX_TOKENS when not given."""
    limit = max_tokens if isinstance(max_tokens, int) and max_tokens >= 1 else DEFAULT_MAX_TOKENS
    return " ".join(reply.split()[:limit])


def request_prompt(payload: Mapping[str, Any], chat: bool) -> str:
    """The prompt an adapter answers: a chat request's last user message (the golden probe's
    only message), or a completion's prompt string."""
    if chat:
        messages = payload.get("messages")
        for message in reversed(messages if isinstance(messages, list) else []):
            if isinstance(message, dict) and message.get("role") == "user":
                return tokens.message_text(message.get("content"))
        return ""
    prompt = payload.get("prompt", "")
    return prompt if isinstance(prompt, str) else ""


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1024 * 1024):
            h.update(block)
    return h.hexdigest()


def read_adapter(path: str) -> AdapterFacts:
    """Read an adapter directory as vLLM's loader does: adapter_config.json (missing: not
    found), then the first weight file there is (none: vLLM's "doesn't contain tensors")."""
    directory = Path(path)
    config_path = directory / CONFIG_NAME
    if not directory.is_dir() or not config_path.is_file():
        raise AdapterNotFound(path)
    with open(config_path, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise AdapterInvalid(f"{CONFIG_NAME} is over {MAX_CONFIG_BYTES} bytes")
    try:
        config = json.loads(data)
    except ValueError as exc:
        raise AdapterInvalid(f"{CONFIG_NAME} is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterInvalid(f"{CONFIG_NAME} must be an object")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise AdapterInvalid(f"{CONFIG_NAME}: r must be a positive integer")
    if config.get("bias", "none") != "none":
        raise AdapterInvalid("Adapter bias is not supported.")
    targets = config.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise AdapterInvalid(f"{CONFIG_NAME}: target_modules must be a list of module names")
    weights = next((directory / n for n in WEIGHT_NAMES if (directory / n).is_file()), None)
    if weights is None:
        raise AdapterInvalid(f"{path} doesn't contain tensors")
    base = config.get("base_model_name_or_path")
    return AdapterFacts(
        path=path,
        rank=rank,
        target_modules=tuple(targets),
        base_model=base if isinstance(base, str) else None,
        weights_sha256=file_sha256(weights),
        behaviour=_behaviour(config.get(SIM_KEY)),
    )


def _behaviour(raw: Any) -> SimBehaviour:
    if raw is None:
        return SimBehaviour()
    if not isinstance(raw, dict):
        raise AdapterInvalid(f"{CONFIG_NAME}: {SIM_KEY} must be an object")
    rate = raw.get("errorRate", 0)
    latency = raw.get("latencyMs", 0)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
        raise AdapterInvalid(f"{CONFIG_NAME}: {SIM_KEY}.errorRate must be from 0 to 1")
    if isinstance(latency, bool) or not isinstance(latency, int):
        raise AdapterInvalid(f"{CONFIG_NAME}: {SIM_KEY}.latencyMs must be an integer")
    if not 0 <= latency <= MAX_LATENCY_MS:
        raise AdapterInvalid(f"{CONFIG_NAME}: {SIM_KEY}.latencyMs must be 0 to {MAX_LATENCY_MS}")
    return SimBehaviour(error_rate=float(rate), latency_ms=latency)


def peft_config(
    *, base_model: str, rank: int, target_modules: tuple[str, ...], bad: SimBehaviour | None
) -> dict[str, Any]:
    """A plausible peft LoRA adapter_config.json, flagged as bad when `bad` is given."""
    config: dict[str, Any] = {
        "base_model_name_or_path": base_model,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": rank,
        "target_modules": list(target_modules),
        "task_type": "CAUSAL_LM",
    }
    if bad is not None:
        config[SIM_KEY] = {"errorRate": bad.error_rate, "latencyMs": bad.latency_ms}
    return config


def fake_weights(
    *, name: str, step: int, seed: int, rank: int, target_modules: tuple[str, ...]
) -> bytes:
    """A small, valid safetensors file of LoRA A/B matrices (float32, 16 wide), its values
    a deterministic function of the name, step and seed: another step, other bytes."""
    width = 16
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    payload = b""
    for module in target_modules:
        for part, shape in (("lora_A", [rank, width]), ("lora_B", [width, rank])):
            key = f"base_model.model.model.layers.0.self_attn.{module}.{part}.weight"
            count = shape[0] * shape[1]
            stream = hashlib.sha256(f"{name}\0{step}\0{seed}\0{key}".encode()).digest()
            values = [(stream[i % 32] - 128) / 1024 for i in range(count)]
            data = struct.pack(f"<{count}f", *values)
            header[key] = {
                "dtype": "F32",
                "shape": shape,
                "data_offsets": [len(payload), len(payload) + len(data)],
            }
            payload += data
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + payload
