"""How the supervisor shapes what it sends: optional fields are left out, never null.

The original control plane's schemas declare optional fields as absent-or-present; a `null`
there fails its validation and the whole call with it. The one field the contract declares
nullable is a model's `sleeping` (state unknown), so that key alone keeps its null.
"""

from __future__ import annotations

from typing import Any

NULLABLE_KEYS = frozenset({"sleeping"})

# What this supervisor accepts beyond the original contract, listed in `GET /v1/status` so a
# control plane can learn it before using it (the original refuses unknown request fields).
FEATURE_PROBE_MODELS = "probe.models"
FEATURE_DRAIN = "sleep.drain"
# The probe body's `seed` and `adapters`: golden probes (greedy, seeded, answers returned) and
# one probe per LoRA adapter.
FEATURE_PROBE_GOLDEN = "probe.golden"
# The sleep's `?drainMs=`: a drain bound the caller gives, after which the sleep aborts what
# still runs (a planned promotion moving long streams to the new active: the proxy continues
# each aborted stream there). The original ignores the parameter and drains in full.
FEATURE_DRAIN_BOUND = "drain-bound"
# `POST /v1/models/swap`: start a model's server from a new profile, probe it, switch its name
# to it (supervisor/swaps.py); progress in the status report's per-model `swap`.
FEATURE_MODEL_SWAP = "model.swap"
# The LoRA adapter routes (`/v1/adapters...`, docs/adapters.md), the profile's `lora` and the
# status report's per-model `adapters`.
FEATURE_ADAPTERS = "adapters"
FEATURES = (
    FEATURE_PROBE_MODELS,
    FEATURE_DRAIN,
    FEATURE_PROBE_GOLDEN,
    FEATURE_DRAIN_BOUND,
    FEATURE_MODEL_SWAP,
    FEATURE_ADAPTERS,
)


def compact(value: Any) -> Any:
    """Drop every None-valued key (recursively) except the contract's nullable ones."""
    if isinstance(value, dict):
        return {k: compact(v) for k, v in value.items() if v is not None or k in NULLABLE_KEYS}
    if isinstance(value, list):
        return [compact(v) for v in value]
    return value
