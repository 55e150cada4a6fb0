"""Swapping a model server to a new profile: what a swap may ask, and how far it has gone.

`POST /v1/models/swap` (feature `model.swap`, ours only) starts the model's server from another
profile (a new checkpoint, engine release or quantization), checks it, then makes it the one that
serves the model's name and stops the old one. Two modes, the operator's choice:

- `new-port`: the new server starts beside the old one on a free port of the config's
  `swapPorts`; the old one serves until the new one has passed its health check and one short
  completion, and keeps serving if it does not. Both run at once: the GPU must hold both.
- `in-place`: the old server is stopped first and the new one starts on its port (a gap the
  caller accepts, for a GPU that cannot hold two). A new server that fails is stopped and the
  old one is started again from its old profile.

The host (`supervisor/host.py`) runs the swap in a task of its own and answers 202 at once; the
status report shows its progress per model (`swap`) and, once switched, the new `port`. The
switch is recorded in the state dir (`records.SwapRecord`), so a restarted supervisor builds the
model from the swapped profile and adopts its process. This module holds the pure parts: the
request's checks and the progress record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from supervisor.clock import iso_utc
from supervisor.config import ModelConfig, parse_secret_ref
from supervisor.engines.profile import parse_profile
from supervisor.engines.registry import EngineRegistry

NEW_PORT = "new-port"
IN_PLACE = "in-place"
MODES = (NEW_PORT, IN_PLACE)
# A profile is a few dozen fields; the request body's 64 KiB cap is for the whole body.
MAX_PROFILE_BYTES = 16 * 1024
# The check before the switch: health, then one short completion, as a failover's probe.
PROBE_PROMPT = "ping"
PROBE_MAX_TOKENS = 4
PROBE_TIMEOUT_S = 60.0
# How long the new server may take to answer its health check (weights load from disk).
DEFAULT_START_TIMEOUT_S = 600.0

# The states of a swap, in order; a swap ends `switched` or `failed`.
STOPPING_OLD = "stopping-old"  # in-place only: the old server is being stopped
STARTING = "starting"
PROBING = "probing"
SWITCHING = "switching"  # the served name points to the new server; the old one is stopping
SWITCHED = "switched"
FAILED = "failed"


class SwapRefused(Exception):
    """A swap that cannot start: nothing was changed. Carries the HTTP status and code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@dataclass
class SwapState:
    """The last swap of one model on this host: its mode, ports and how far it went."""

    mode: str
    port: int
    previous_port: int
    started_at: float
    state: str = STARTING
    ended_at: float | None = None
    error: str | None = None
    # Read back from the state dir at start-up (the swap was made by an earlier supervisor).
    recorded: bool = False
    # The profile as the caller wrote it (what the record keeps); never reported.
    profile: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def in_flight(self) -> bool:
        return self.state not in (SWITCHED, FAILED)

    def finish(self, state: str, at: float, error: str | None = None) -> None:
        self.state, self.ended_at, self.error = state, at, error

    def describe(self) -> dict[str, Any]:
        """The status report's `swap` entry (None values are left out on the wire)."""
        return {
            "state": self.state,
            "mode": self.mode,
            "port": self.port,
            "previousPort": self.previous_port,
            "startedAt": iso_utc(self.started_at),
            "endedAt": iso_utc(self.ended_at) if self.ended_at is not None else None,
            "error": self.error,
            "recorded": self.recorded or None,
        }


def swapped_config(
    base: ModelConfig,
    profile: Any,
    api_key: Any,
    *,
    registry: EngineRegistry,
    cwd: Path,
) -> ModelConfig:
    """The model's config with `profile` (and `api_key`, when given) in place of its own.

    The profile is checked as the config's are (the same schema and rules: supervisor/config.py
    `_parse_model`), and must still run on the model's slot GPU. Raise SwapRefused (400) naming
    every problem. An absent `api_key` keeps the model's reference: its clients use one key.
    """
    size = len(json.dumps(profile, separators=(",", ":")))
    if size > MAX_PROFILE_BYTES:
        raise SwapRefused(
            400, "invalid_request", f"profile: is {size} bytes of JSON; at most {MAX_PROFILE_BYTES}"
        )
    errors: list[str] = []
    parsed = parse_profile(
        profile,
        "profile",
        errors,
        model_name=base.name,
        default_gpu_index=base.gpu_index,
        engine_names=registry.names(),
    )
    key = base.api_key if api_key is None else parse_secret_ref(api_key, "apiKey", errors, cwd)
    if parsed is not None:
        if base.gpu_index not in parsed.gpu_indices:
            errors.append(
                f"profile: runs on GPUs {list(parsed.gpu_indices)}, which do not include the "
                f"model's slot GPU {base.gpu_index}"
            )
        if parsed.nodes > 1:
            # Each node's supervisor starts its own rank; one host cannot swap them together.
            errors.append("profile.nodes: a multi-node server cannot be swapped")
        errors += [f"profile: {p}" for p in registry.get(parsed.engine).validate(parsed, {})]
    if errors or parsed is None:
        raise SwapRefused(400, "invalid_request", "; ".join(errors))
    return replace(base, engine=parsed.engine, profile=parsed, api_key=key)
