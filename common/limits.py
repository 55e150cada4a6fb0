"""Limits the supervisor and the control plane must agree on, written once.

Standard library only and free of any supervisor state, so the control plane's pure core can
import it: the probe policy an operator sets must fit what the supervisor's probe accepts.
"""

from __future__ import annotations

# Millisecond budgets end up in timers and in Postgres integer columns; 2**31 - 1 keeps both
# honest (a larger "effectively infinite" value would overflow or fire at once).
MAX_MS = 2**31 - 1
# The readiness probe: a short prompt and a few tokens prove a model answers.
MAX_PROBE_PROMPT_CHARS = 8192
MAX_PROBE_TOKENS = 256
# GPU indices as NVML numbers them; a host with more than 1024 GPUs is not a host.
MAX_GPU_INDEX = 1023
# Tensor/pipeline parallel degree, nodes per group and GPUs per profile.
MAX_PARALLEL = 1024
MAX_PORT = 65535
# Items in one engine profile's lists and maps (extraArgs, env): generous for any honest
# profile, small enough that a pasted blob is refused before it reaches a command line.
MAX_PROFILE_ITEMS = 1024
# A golden probe: at most this many LoRA adapters per model are probed, each one completion.
MAX_PROBE_ADAPTERS = 16
# One call of a provisioning driver (a `sky` command, an operator's script): a pass renews its
# lease per domain (330 s) and makes at most two calls for one domain (stop, then describe).
MAX_DRIVER_CALL_S = 150
