"""Fleet policy: defaults, strict validation (`schemas/policy.json`) and its resolved view.

A fleet stores only the keys its operator set (`validate_policy` output); every read resolves the
rest from `DEFAULTS`, so changing a default reaches every fleet that did not pin the value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from common.documents import problems, schema_validator

# The limits (milliseconds, the probe's bounds) are common/limits.py's, named by the schema:
# the supervisor enforces the same on its side.

DEFAULTS: dict[str, Any] = {
    "autoFailover": False,
    # A standby that is back and healthy but awake (a former active whose host returned after
    # the promotion's own demote steps gave up) is demoted to standby posture by the reconciler.
    "restoreStandbyOnReturn": True,
    "heartbeatStaleMs": 30_000,
    "degradedGraceMs": 60_000,
    "trainingStopGraceMs": 30_000,
    # The same grace when the promotion is a failover (the active failed): the outage waits for
    # it, and trainers resume from their periodic checkpoints (the readiness verdict checks
    # they take them), so by default SIGKILL follows SIGTERM at once. 1 is the least the
    # original supervisor accepts.
    "failoverTrainingStopGraceMs": 1,
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
    # After a failed automatic promotion, that standby waits failoverBackoffMs before the next
    # attempt, doubling per failure in a row up to failoverBackoffMaxMs (fleets.core.backoff):
    # a standby whose probe keeps failing gets a few attempts a minute, not one per tick.
    "failoverBackoffMs": 15_000,
    "failoverBackoffMaxMs": 300_000,
    # Failover readiness (fleets/core/readiness.py): a standby trainer whose last checkpoint is
    # older than this is not checkpointing; a passing drill older than this proves too little.
    "checkpointMaxAgeMs": 3_600_000,
    "drillMaxAgeMs": 604_800_000,
    # The recovery time objective: the p95 failover (drills and real ones, detection to
    # routing moved) the fleet promises; /metrics exports it beside the measured p95.
    "rtoMs": 300_000,
    # Data-path detection (fleets.reconciler.datapath): a model server asked directly (its
    # supervisor cannot vouch for it) and each call of a confirmation round is bounded by this.
    "servingCheckTimeoutMs": 500,
    # A host a proxy could not reach is failed only when its supervisor and model servers refuse
    # connections on two checks this far apart (one refused connection is not an outage).
    "dataPathConfirmIntervalMs": 200,
}

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


def _storable(value: str, path: str) -> None:
    # Postgres jsonb refuses NUL and lone surrogates; refuse them here with a path instead of a
    # database error at save time (the semantic pass: a schema cannot say it readably).
    if "\x00" in value:
        raise PolicyError(path, "must not contain NUL characters")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise PolicyError(path, "must be valid Unicode (no lone surrogates)")


def validate_policy(raw: object, *, path: str = "policy") -> dict[str, Any]:
    """Validate an operator-written policy and return the normalized keys that were set.

    Structure and limits are `schemas/policy.json`'s (unknown keys first, then the keys in
    `DEFAULTS` order, so the first error reported is deterministic); raise PolicyError naming
    the first offending field. Unset keys stay unset: the result is what gets stored, and
    defaults are applied on read by `Policy.resolve`.
    """
    validator = schema_validator("fleets.core", "policy")
    if not validator.is_valid(raw):  # the common case (every read of a stored policy) is valid
        raise PolicyError(*problems(validator, raw, path)[0])
    assert isinstance(raw, Mapping)  # the schema refuses anything else
    out: dict[str, Any] = {}
    for key in DEFAULTS:  # stored in the policy table's order
        if key not in raw:
            continue
        value = raw[key]
        if key == "verifyGpuMaxUsedRatio":
            value = float(value)
        elif key == "probe":
            value = {k: value[k] for k in DEFAULTS["probe"] if k in value}
            if "prompt" in value:
                _storable(value["prompt"], f"{path}.probe.prompt")
        out[key] = value
    _backoff_in_order(out, path)
    return out


def _backoff_in_order(given: Mapping[str, Any], path: str) -> None:
    """Refuse a backoff cap below its first step (each side resolved against the defaults)."""
    if "failoverBackoffMs" not in given and "failoverBackoffMaxMs" not in given:
        return
    first = given.get("failoverBackoffMs", DEFAULTS["failoverBackoffMs"])
    cap = given.get("failoverBackoffMaxMs", DEFAULTS["failoverBackoffMaxMs"])
    if cap < first:
        raise PolicyError(
            f"{path}.failoverBackoffMaxMs",
            f"must be at least failoverBackoffMs ({first}); got {cap}",
        )


@lru_cache(maxsize=256)
def _validated_text(text: str) -> dict[str, Any]:
    return validate_policy(json.loads(text))


def _validated(raw: object) -> dict[str, Any]:
    """`validate_policy`, remembered per document: every fleet read resolves its stored policy,
    and the schema check costs far more than the rest of a resolve."""
    try:
        text = json.dumps(raw, sort_keys=True)
    except (TypeError, ValueError):  # not a JSON document: the check says why, uncached
        return validate_policy(raw)
    return _validated_text(text)  # shared: resolve only reads it


@dataclass(frozen=True)
class Policy:
    """A fully resolved fleet policy; field defaults equal `DEFAULTS`."""

    auto_failover: bool = DEFAULTS["autoFailover"]
    restore_standby_on_return: bool = DEFAULTS["restoreStandbyOnReturn"]
    heartbeat_stale_ms: int = DEFAULTS["heartbeatStaleMs"]
    degraded_grace_ms: int = DEFAULTS["degradedGraceMs"]
    training_stop_grace_ms: int = DEFAULTS["trainingStopGraceMs"]
    failover_training_stop_grace_ms: int = DEFAULTS["failoverTrainingStopGraceMs"]
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
    failover_backoff_ms: int = DEFAULTS["failoverBackoffMs"]
    failover_backoff_max_ms: int = DEFAULTS["failoverBackoffMaxMs"]
    checkpoint_max_age_ms: int = DEFAULTS["checkpointMaxAgeMs"]
    drill_max_age_ms: int = DEFAULTS["drillMaxAgeMs"]
    rto_ms: int = DEFAULTS["rtoMs"]
    serving_check_timeout_ms: int = DEFAULTS["servingCheckTimeoutMs"]
    data_path_confirm_interval_ms: int = DEFAULTS["dataPathConfirmIntervalMs"]

    @classmethod
    def resolve(cls, raw: Mapping[str, Any] | None) -> Policy:
        """Validate the stored operator keys and fill every unset key from `DEFAULTS`."""
        given = _validated(raw if raw is not None else {})
        merged = {**DEFAULTS, **given, "probe": {**DEFAULTS["probe"], **given.get("probe", {})}}
        return cls(
            auto_failover=merged["autoFailover"],
            restore_standby_on_return=merged["restoreStandbyOnReturn"],
            heartbeat_stale_ms=merged["heartbeatStaleMs"],
            degraded_grace_ms=merged["degradedGraceMs"],
            training_stop_grace_ms=merged["trainingStopGraceMs"],
            failover_training_stop_grace_ms=merged["failoverTrainingStopGraceMs"],
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
            failover_backoff_ms=merged["failoverBackoffMs"],
            failover_backoff_max_ms=merged["failoverBackoffMaxMs"],
            checkpoint_max_age_ms=merged["checkpointMaxAgeMs"],
            drill_max_age_ms=merged["drillMaxAgeMs"],
            rto_ms=merged["rtoMs"],
            serving_check_timeout_ms=merged["servingCheckTimeoutMs"],
            data_path_confirm_interval_ms=merged["dataPathConfirmIntervalMs"],
        )

    def training_stop_grace(self, *, outage: bool) -> int:
        """SIGTERM to SIGKILL for trainers stopped for a promotion; `outage`: a failover."""
        return self.failover_training_stop_grace_ms if outage else self.training_stop_grace_ms

    def to_json(self) -> dict[str, Any]:
        """Return the resolved policy in the public camelCase shape of `DEFAULTS`."""
        return {
            "autoFailover": self.auto_failover,
            "restoreStandbyOnReturn": self.restore_standby_on_return,
            "heartbeatStaleMs": self.heartbeat_stale_ms,
            "degradedGraceMs": self.degraded_grace_ms,
            "trainingStopGraceMs": self.training_stop_grace_ms,
            "failoverTrainingStopGraceMs": self.failover_training_stop_grace_ms,
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
            "failoverBackoffMs": self.failover_backoff_ms,
            "failoverBackoffMaxMs": self.failover_backoff_max_ms,
            "checkpointMaxAgeMs": self.checkpoint_max_age_ms,
            "drillMaxAgeMs": self.drill_max_age_ms,
            "rtoMs": self.rto_ms,
            "servingCheckTimeoutMs": self.serving_check_timeout_ms,
            "dataPathConfirmIntervalMs": self.data_path_confirm_interval_ms,
        }

    def step_timeout_ms(self, step: str) -> int:
        """Return the time budget of an operation step; raise ValueError for an unknown step."""
        # A round-trip drill's second leg runs the promotion's steps under the same budgets.
        name = _STEP_TIMEOUT_FIELDS.get(step.removeprefix("back_"))
        if name is None:
            raise ValueError(f"unknown step {step!r}")
        budget: int = getattr(self, name)
        return budget
