"""Fleet policy: defaults, strict validation and the resolved, typed view of it.

A fleet stores only the keys its operator set (`validate_policy` output); every read resolves the
rest from `DEFAULTS`, so changing a default reaches every fleet that did not pin the value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from supervisor.limits import MAX_MS, MAX_PROBE_PROMPT_CHARS, MAX_PROBE_TOKENS

# The supervisor enforces the same limits on its side (supervisor/limits.py).
MAX_TIMEOUT_MS = MAX_MS
PROBE_PROMPT_MAX_CHARS = MAX_PROBE_PROMPT_CHARS
PROBE_MAX_TOKENS_MAX = MAX_PROBE_TOKENS

DEFAULTS: dict[str, Any] = {
    "autoFailover": False,
    # A standby that is back and healthy but awake (a former active whose host returned after
    # the promotion's own demote steps gave up) is demoted to standby posture by the reconciler.
    "restoreStandbyOnReturn": True,
    "heartbeatStaleMs": 30_000,
    "degradedGraceMs": 60_000,
    "trainingStopGraceMs": 30_000,
    "stopTrainingTimeoutMs": 90_000,
    "verifyGpuTimeoutMs": 30_000,
    "wakeTimeoutMs": 120_000,
    "probeTimeoutMs": 60_000,
    "switchActiveTimeoutMs": 10_000,
    "sleepTimeoutMs": 60_000,
    "startTrainingTimeoutMs": 30_000,
    # A sleeping vLLM keeps its CUDA context and allocator pools, so "released" means under a
    # ratio of the card, not zero.
    "verifyGpuMaxUsedRatio": 0.25,
    "probe": {"prompt": "ping", "maxTokens": 4},
    # Provisioned domains (provider skypilot/skyserve with driver settings; docs/drivers.md).
    # A failed non-active domain is re-provisioned after the grace (it may come back by itself):
    # one that failed as a standby, and one that was the active until a failover moved off it.
    "replaceFailedStandby": True,
    "replaceFailedActive": True,
    "replaceFailedGraceMs": 60_000,
    # From entering `provisioning` to the first good heartbeat; then the domain goes `failed`.
    # Cloud launches of GPU nodes take minutes (image pull, weights); 30 min covers a cold one.
    "provisionTimeoutMs": 1_800_000,
    # Wait after a failed launch before the next candidate region/zone is tried.
    "provisionRetryBackoffMs": 30_000,
    # How a stopped domain is torn down: `down` deletes the cluster (nothing billed), `stop`
    # keeps its disks (faster restart, disks billed). A domain's driver.stopMode wins.
    "stopMode": "down",
}

_TIMEOUT_KEYS = (
    "heartbeatStaleMs",
    "degradedGraceMs",
    "trainingStopGraceMs",
    "stopTrainingTimeoutMs",
    "verifyGpuTimeoutMs",
    "wakeTimeoutMs",
    "probeTimeoutMs",
    "switchActiveTimeoutMs",
    "sleepTimeoutMs",
    "startTrainingTimeoutMs",
    "replaceFailedGraceMs",
    "provisionTimeoutMs",
    "provisionRetryBackoffMs",
)
_BOOL_KEYS = (
    "autoFailover",
    "restoreStandbyOnReturn",
    "replaceFailedStandby",
    "replaceFailedActive",
)
STOP_MODES = ("down", "stop")

# Which Policy field bounds each operation step (step names from fleets.core.states).
_STEP_TIMEOUT_FIELDS = {
    "stop_training": "stop_training_timeout_ms",
    "verify_gpu": "verify_gpu_timeout_ms",
    "wake": "wake_timeout_ms",
    "probe": "probe_timeout_ms",
    "switch_route": "switch_active_timeout_ms",
    "demote_old_sleep": "sleep_timeout_ms",
    "sleep": "sleep_timeout_ms",
    "demote_old_train": "start_training_timeout_ms",
    "start_training": "start_training_timeout_ms",
}


class PolicyError(ValueError):
    """A policy value that breaks a rule; `path` names the field, `rule` says what is wrong."""

    def __init__(self, path: str, rule: str) -> None:
        super().__init__(f"{path}: {rule}")
        self.path = path
        self.rule = rule


def _is_int(value: object) -> TypeGuard[int]:
    # bool is an int subclass; `true` is never a valid number of milliseconds.
    return isinstance(value, int) and not isinstance(value, bool)


def _check_keys(raw: Mapping[Any, Any], allowed: Mapping[str, Any], path: str) -> None:
    # Strict on purpose: a misspelled `autoFailver` silently dropped would leave a safety
    # switch at its default.
    for key in sorted(raw, key=str):
        if not isinstance(key, str) or key not in allowed:
            raise PolicyError(f"{path}.{key}", "unknown field")


def _timeout(value: object, path: str) -> int:
    if not _is_int(value):
        raise PolicyError(path, "must be an integer number of milliseconds")
    if not 1 <= value <= MAX_TIMEOUT_MS:
        raise PolicyError(path, f"must be between 1 and {MAX_TIMEOUT_MS}")
    return int(value)


def _ratio(value: object, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolicyError(path, "must be a number")
    if not math.isfinite(value) or not 0 < value <= 1:
        raise PolicyError(path, "must be greater than 0 and at most 1")
    return float(value)


def _prompt(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise PolicyError(path, "must be a string")
    if not 1 <= len(value) <= PROBE_PROMPT_MAX_CHARS:
        raise PolicyError(path, f"must be 1 to {PROBE_PROMPT_MAX_CHARS} characters")
    # Postgres jsonb refuses NUL and lone surrogates; refuse them here with a path instead of a
    # database error at save time.
    if "\x00" in value:
        raise PolicyError(path, "must not contain NUL characters")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise PolicyError(path, "must be valid Unicode (no lone surrogates)")
    return value


def _probe(value: object, path: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise PolicyError(path, "must be an object")
    _check_keys(value, DEFAULTS["probe"], path)
    out: dict[str, Any] = {}
    if "prompt" in value:
        out["prompt"] = _prompt(value["prompt"], f"{path}.prompt")
    if "maxTokens" in value:
        tokens = value["maxTokens"]
        if not _is_int(tokens) or not 1 <= tokens <= PROBE_MAX_TOKENS_MAX:
            raise PolicyError(
                f"{path}.maxTokens", f"must be an integer between 1 and {PROBE_MAX_TOKENS_MAX}"
            )
        out["maxTokens"] = int(tokens)
    return out


def validate_policy(raw: object, *, path: str = "policy") -> dict[str, Any]:
    """Validate an operator-written policy and return the normalized keys that were set.

    Raise PolicyError naming the first offending field. Unset keys stay unset: the result is
    what gets stored, and defaults are applied on read by `Policy.resolve`.
    """
    if not isinstance(raw, Mapping):
        raise PolicyError(path, "must be an object")
    _check_keys(raw, DEFAULTS, path)
    out: dict[str, Any] = {}
    for key in DEFAULTS:  # fixed order: the first error reported is deterministic
        if key not in raw:
            continue
        value, where = raw[key], f"{path}.{key}"
        if key in _BOOL_KEYS:
            if not isinstance(value, bool):
                raise PolicyError(where, "must be true or false")
            out[key] = value
        elif key == "stopMode":
            if value not in STOP_MODES:
                raise PolicyError(where, 'must be "down" or "stop"')
            out[key] = value
        elif key in _TIMEOUT_KEYS:
            out[key] = _timeout(value, where)
        elif key == "verifyGpuMaxUsedRatio":
            out[key] = _ratio(value, where)
        else:  # probe
            out[key] = _probe(value, where)
    return out


@dataclass(frozen=True)
class Policy:
    """A fully resolved fleet policy; field defaults equal `DEFAULTS`."""

    auto_failover: bool = DEFAULTS["autoFailover"]
    restore_standby_on_return: bool = DEFAULTS["restoreStandbyOnReturn"]
    heartbeat_stale_ms: int = DEFAULTS["heartbeatStaleMs"]
    degraded_grace_ms: int = DEFAULTS["degradedGraceMs"]
    training_stop_grace_ms: int = DEFAULTS["trainingStopGraceMs"]
    stop_training_timeout_ms: int = DEFAULTS["stopTrainingTimeoutMs"]
    verify_gpu_timeout_ms: int = DEFAULTS["verifyGpuTimeoutMs"]
    wake_timeout_ms: int = DEFAULTS["wakeTimeoutMs"]
    probe_timeout_ms: int = DEFAULTS["probeTimeoutMs"]
    switch_active_timeout_ms: int = DEFAULTS["switchActiveTimeoutMs"]
    sleep_timeout_ms: int = DEFAULTS["sleepTimeoutMs"]
    start_training_timeout_ms: int = DEFAULTS["startTrainingTimeoutMs"]
    verify_gpu_max_used_ratio: float = DEFAULTS["verifyGpuMaxUsedRatio"]
    probe_prompt: str = DEFAULTS["probe"]["prompt"]
    probe_max_tokens: int = DEFAULTS["probe"]["maxTokens"]
    replace_failed_standby: bool = DEFAULTS["replaceFailedStandby"]
    replace_failed_active: bool = DEFAULTS["replaceFailedActive"]
    replace_failed_grace_ms: int = DEFAULTS["replaceFailedGraceMs"]
    provision_timeout_ms: int = DEFAULTS["provisionTimeoutMs"]
    provision_retry_backoff_ms: int = DEFAULTS["provisionRetryBackoffMs"]
    stop_mode: str = DEFAULTS["stopMode"]

    @classmethod
    def resolve(cls, raw: Mapping[str, Any] | None) -> Policy:
        """Validate the stored operator keys and fill every unset key from `DEFAULTS`."""
        given = validate_policy(raw if raw is not None else {})
        merged = {**DEFAULTS, **given, "probe": {**DEFAULTS["probe"], **given.get("probe", {})}}
        return cls(
            auto_failover=merged["autoFailover"],
            restore_standby_on_return=merged["restoreStandbyOnReturn"],
            heartbeat_stale_ms=merged["heartbeatStaleMs"],
            degraded_grace_ms=merged["degradedGraceMs"],
            training_stop_grace_ms=merged["trainingStopGraceMs"],
            stop_training_timeout_ms=merged["stopTrainingTimeoutMs"],
            verify_gpu_timeout_ms=merged["verifyGpuTimeoutMs"],
            wake_timeout_ms=merged["wakeTimeoutMs"],
            probe_timeout_ms=merged["probeTimeoutMs"],
            switch_active_timeout_ms=merged["switchActiveTimeoutMs"],
            sleep_timeout_ms=merged["sleepTimeoutMs"],
            start_training_timeout_ms=merged["startTrainingTimeoutMs"],
            verify_gpu_max_used_ratio=merged["verifyGpuMaxUsedRatio"],
            probe_prompt=merged["probe"]["prompt"],
            probe_max_tokens=merged["probe"]["maxTokens"],
            replace_failed_standby=merged["replaceFailedStandby"],
            replace_failed_active=merged["replaceFailedActive"],
            replace_failed_grace_ms=merged["replaceFailedGraceMs"],
            provision_timeout_ms=merged["provisionTimeoutMs"],
            provision_retry_backoff_ms=merged["provisionRetryBackoffMs"],
            stop_mode=merged["stopMode"],
        )

    def to_json(self) -> dict[str, Any]:
        """Return the resolved policy in the public camelCase shape of `DEFAULTS`."""
        return {
            "autoFailover": self.auto_failover,
            "restoreStandbyOnReturn": self.restore_standby_on_return,
            "heartbeatStaleMs": self.heartbeat_stale_ms,
            "degradedGraceMs": self.degraded_grace_ms,
            "trainingStopGraceMs": self.training_stop_grace_ms,
            "stopTrainingTimeoutMs": self.stop_training_timeout_ms,
            "verifyGpuTimeoutMs": self.verify_gpu_timeout_ms,
            "wakeTimeoutMs": self.wake_timeout_ms,
            "probeTimeoutMs": self.probe_timeout_ms,
            "switchActiveTimeoutMs": self.switch_active_timeout_ms,
            "sleepTimeoutMs": self.sleep_timeout_ms,
            "startTrainingTimeoutMs": self.start_training_timeout_ms,
            "verifyGpuMaxUsedRatio": self.verify_gpu_max_used_ratio,
            "probe": {"prompt": self.probe_prompt, "maxTokens": self.probe_max_tokens},
            "replaceFailedStandby": self.replace_failed_standby,
            "replaceFailedActive": self.replace_failed_active,
            "replaceFailedGraceMs": self.replace_failed_grace_ms,
            "provisionTimeoutMs": self.provision_timeout_ms,
            "provisionRetryBackoffMs": self.provision_retry_backoff_ms,
            "stopMode": self.stop_mode,
        }

    def step_timeout_ms(self, step: str) -> int:
        """Return the time budget of an operation step; raise ValueError for an unknown step."""
        name = _STEP_TIMEOUT_FIELDS.get(step)
        if name is None:
            raise ValueError(f"unknown step {step!r}")
        budget: int = getattr(self, name)
        return budget
