"""Fleet policy: the table of its keys, strict validation and its resolved view.

Each key is declared once, as a field of `Policy` (its type, default, schema and meaning); the
defaults, the JSON Schema (`policy_schema`, shipped as `schemas/policy.json` for readers outside
the code), the public JSON and the step budgets are read from those fields.

A fleet stores only the keys its operator set (`validate_policy` output); every read resolves the
rest from `DEFAULTS`, so changing a default reaches every fleet that did not pin the value.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from functools import cache, lru_cache
from typing import Any

from common.documents import problems, strict_validator
from fleets.core.adapter_rollout import DEFAULT_ADAPTER_STEPS, DEFAULT_PREPARE_TIMEOUT_MS
from fleets.core.rollout import MAX_DWELL_S, MAX_STEPS, RolloutInvalid, steps_parse
from fleets.core.states import Step, leg_step

# Bounds of the keys: the limits are common/limits.py's (the supervisor enforces the same on its
# side), named by the schema as "$limits.NAME" and filled in by common.documents.
SWITCH: dict[str, Any] = {"$ref": "#/$defs/switch"}
TIMEOUT: dict[str, Any] = {"$ref": "#/$defs/timeout"}
MILLISECONDS = "must be an integer number of milliseconds"


def _bounded(
    kind: str | list[str], bounds: dict[str, Any], *, type_rule: str, range_rule: str | None = None
) -> dict[str, Any]:
    """A schema of JSON type `kind` within `bounds` (keyword: limit); a value past either end is
    refused with the same words (`range_rule`, or the type's where one sentence says both)."""
    return {
        "type": kind,
        **bounds,
        "x-rules": {"type": type_rule, **dict.fromkeys(bounds, range_rule or type_rule)},
    }


_DEFS: dict[str, Any] = {
    "switch": {"type": "boolean", "x-rules": {"type": "must be true or false"}},
    "timeout": _bounded(
        "integer",
        {"minimum": 1, "maximum": "$limits.MAX_MS"},
        type_rule=MILLISECONDS,
        range_rule="must be between 1 and {MAX_MS}",
    ),
}


def _ms_between(low: int, high: int) -> dict[str, Any]:
    return _bounded(
        "integer",
        {"minimum": low, "maximum": high},
        type_rule=MILLISECONDS,
        range_rule=f"must be between {low} and {high}",
    )


def _one_of(*choices: str) -> dict[str, Any]:
    return {"enum": list(choices), "x-rule": "must be " + " or ".join(f'"{c}"' for c in choices)}


def _key(
    default: Any,
    schema: dict[str, Any],
    doc: str,
    *,
    within: str = "",
    steps: tuple[Step, ...] = (),
) -> Any:
    """One row of the policy table: a Policy field with its default, its schema (type and
    bounds), what it means, the object it sits in (`probe`) and the steps it bounds."""
    return field(
        default=default, metadata={"schema": schema, "doc": doc, "within": within, "steps": steps}
    )


@dataclass(frozen=True)
class Policy:
    """A fully resolved fleet policy, and the policy table: one field per key.

    Each field is declared once here; its public camelCase name (`heartbeat_stale_ms` is
    `heartbeatStaleMs`, `probe_max_tokens` is `probe.maxTokens`), `DEFAULTS`, the schema
    (`policy_schema`, shipped as `schemas/policy.json`), `resolve` and `to_json` follow from it.
    """

    auto_failover: bool = _key(
        False, SWITCH, "Promote a viable standby on its own when the active fails or goes stale."
    )
    # A standby that is back and healthy but awake (a former active whose host returned after
    # the promotion's own demote steps gave up) is demoted to standby posture by the reconciler.
    restore_standby_on_return: bool = _key(
        True,
        SWITCH,
        "Demote a standby that is back, healthy and awake (typically the old active returning "
        "after a failover) to standby posture; a failed attempt is retried after 5 minutes.",
    )
    heartbeat_stale_ms: int = _key(
        30_000, TIMEOUT, "A domain not heard from for this long is stale."
    )
    # An idle fleet's cost is mostly its standby's heartbeats (fleets.core.heartbeat_cadence).
    standby_heartbeat_ms: int = _key(
        10_000,
        _ms_between(0, 3_600_000),
        "A healthy standby (ready, answering, with a ready active and nothing in flight) is "
        "asked for its status at most this often instead of every tick; capped at a third of "
        "heartbeatStaleMs, so a standby that stopped answering is noticed within that plus one "
        "reconcile interval. 0: every tick.",
    )
    degraded_grace_ms: int = _key(
        60_000,
        TIMEOUT,
        "An active degraded this long is escalated to failed (with autoFailover), unless its "
        "data path still serves: every model server up and seen within heartbeatStaleMs.",
    )
    training_stop_grace_ms: int = _key(
        30_000, TIMEOUT, "SIGTERM to SIGKILL grace given to trainers (planned promotions, drills)."
    )
    # The same grace when the promotion is a failover (the active failed): the outage waits for
    # it, and trainers resume from their periodic checkpoints (the readiness verdict checks
    # they take them), so by default SIGKILL follows SIGTERM at once. 1 is the least the
    # original supervisor accepts.
    failover_training_stop_grace_ms: int = _key(
        1,
        TIMEOUT,
        "The same grace when the promotion is a failover: the outage waits for it, so by "
        "default the trainer is killed at once and resumes from its last periodic checkpoint.",
    )
    stop_training_timeout_ms: int = _key(
        90_000, TIMEOUT, "Budget of stop_training.", steps=(Step.STOP_TRAINING,)
    )
    verify_gpu_timeout_ms: int = _key(
        30_000, TIMEOUT, "Budget of verify_gpu.", steps=(Step.VERIFY_GPU,)
    )
    wake_timeout_ms: int = _key(120_000, TIMEOUT, "Budget of wake.", steps=(Step.WAKE,))
    probe_timeout_ms: int = _key(60_000, TIMEOUT, "Budget of probe.", steps=(Step.PROBE,))
    switch_active_timeout_ms: int = _key(
        10_000, TIMEOUT, "Budget of switch_route.", steps=(Step.SWITCH_ROUTE,)
    )
    sleep_timeout_ms: int = _key(
        60_000,
        TIMEOUT,
        "Budget of demote_old_sleep and sleep.",
        steps=(Step.DEMOTE_OLD_SLEEP, Step.SLEEP),
    )
    start_training_timeout_ms: int = _key(
        30_000,
        TIMEOUT,
        "Budget of demote_old_train and start_training.",
        steps=(Step.DEMOTE_OLD_TRAIN, Step.START_TRAINING),
    )
    # Stream migration (fleets.core.stream_migration): a planned promotion ends the old
    # active's drain this long after it starts, and the sleep aborts what still runs; the proxy
    # continues each aborted stream on the new active (and re-runs an aborted non-streamed
    # answer). 0, the default, moves them at the switch, so a promotion with answers in flight
    # lasts as long as one without; a grace lets short answers finish where they are, and is
    # added to the promotion whole when a long one runs. null keeps the full drain.
    stream_migration_after_ms: int | None = _key(
        0,
        _bounded(
            ["integer", "null"],
            {"minimum": 0, "maximum": "$limits.MAX_MS"},
            type_rule="must be an integer number of milliseconds, or null",
            range_rule="must be between 0 and {MAX_MS}",
        ),
        "A planned promotion lets the old active's requests finish for this long (0: not at "
        "all), then moves the streams still running to the new active (continued token for "
        "token by the proxy) instead of waiting for them; only when every model on both domains "
        "can continue (engine vllm or sim) and the old active's supervisor lists drain-bound. "
        "null keeps the full drain.",
    )
    # A sleeping vLLM keeps its CUDA context and allocator pools, so "released" means under a
    # ratio of the card, not zero.
    verify_gpu_max_used_ratio: float = _key(
        0.25,
        _bounded(
            "number",
            {"exclusiveMinimum": 0, "maximum": 1},
            type_rule="must be a number",
            range_rule="must be greater than 0 and at most 1",
        ),
        "verify_gpu passes when used/total on each training GPU is at most this (a sleeping "
        "vLLM keeps its CUDA context, so not zero).",
    )
    probe_prompt: str = _key(
        "ping",
        _bounded(
            "string",
            {"minLength": 1, "maxLength": "$limits.MAX_PROBE_PROMPT_CHARS"},
            type_rule="must be a string",
            range_rule="must be 1 to {MAX_PROBE_PROMPT_CHARS} characters",
        ),
        "The golden probe's synthetic prompt.",
        within="probe",
    )
    probe_max_tokens: int = _key(
        4,
        _bounded(
            "integer",
            {"minimum": 1, "maximum": "$limits.MAX_PROBE_TOKENS"},
            type_rule="must be an integer between 1 and {MAX_PROBE_TOKENS}",
        ),
        "The golden probe's completion length, in tokens.",
        within="probe",
    )
    # Provisioned domains (provider skypilot/skyserve with driver settings; docs/drivers.md).
    # A failed non-active domain is re-provisioned after the grace (it may come back by itself):
    # one that failed as a standby, and one that was the active until a failover moved off it.
    replace_failed_standby: bool = _key(
        True, SWITCH, "Re-provision a Haru-provisioned standby that failed (or stayed unreachable)."
    )
    replace_failed_active: bool = _key(
        True, SWITCH, "Re-provision the domain a failover moved routing off."
    )
    replace_failed_grace_ms: int = _key(
        60_000, TIMEOUT, "How long a domain stays failed or unreachable before it is replaced."
    )
    # Cloud launches of GPU nodes take minutes (image pull, weights); 30 min covers a cold one.
    provision_timeout_ms: int = _key(
        1_800_000,
        TIMEOUT,
        "From provisioning to up; then the domain goes failed with the driver's error.",
    )
    provision_retry_backoff_ms: int = _key(
        30_000, TIMEOUT, "Wait after a failed launch before the next try."
    )
    # A domain's driver.stopMode wins.
    stop_mode: str = _key(
        "down",
        _one_of("down", "stop"),
        "down deletes a stopped domain's cluster, stop keeps its disks (a domain's "
        "driver.stopMode wins).",
    )
    # Doubling per failure in a row up to failoverBackoffMaxMs (fleets.core.backoff): a standby
    # whose probe keeps failing gets a few attempts a minute, not one per tick.
    failover_backoff_ms: int = _key(
        15_000,
        TIMEOUT,
        "After a failed (or cancelled) automatic promotion, auto-failover waits this long "
        "before picking the same standby again, doubling per failure in a row.",
    )
    failover_backoff_max_ms: int = _key(
        300_000, TIMEOUT, "The cap of that wait; must be at least failoverBackoffMs."
    )
    # Flap damping (fleets.core.flapping): a host that crashes and comes back every few seconds
    # gets at most this many failovers per window, then each further one waits for the active
    # to stay lost (the proxy holds requests meanwhile; a host back in place serves them).
    flap_window_ms: int = _key(
        600_000, TIMEOUT, "Flap damping: automatic failovers within this window are counted."
    )
    flap_max_failovers: int = _key(
        2,
        _bounded(
            "integer",
            {"minimum": 0, "maximum": 100},
            type_rule="must be an integer between 0 and 100",
        ),
        "Flap damping: this many automatic failovers within flapWindowMs damp the fleet "
        "(0 switches damping off).",
    )
    flap_hold_down_ms: int = _key(
        30_000,
        TIMEOUT,
        "Flap damping: while damped, a failover needs the active lost this long (not just "
        "confirmed lost), doubling with every failover past flapMaxFailovers, capped at "
        "flapWindowMs; a returned standby's posture is not restored meanwhile.",
    )
    # Failover readiness (fleets/core/readiness.py).
    checkpoint_max_age_ms: int = _key(
        3_600_000,
        TIMEOUT,
        "Failover readiness: a standby trainer whose last checkpoint is older is not "
        "checkpointing.",
    )
    drill_max_age_ms: int = _key(
        604_800_000,
        TIMEOUT,
        "Failover readiness: a passing drill older than this no longer counts as proof.",
    )
    # An original supervisor runs no golden probes and reports no checkpoint times, so those
    # proofs never come; an operator who knows it accepts them here (fleets/core/readiness.py).
    readiness_accept_missing: tuple[str, ...] = _key(
        (),
        {
            "type": "array",
            "items": _one_of("baselines", "trainer", "drill", "wakeMemory"),
            "uniqueItems": True,
            "x-rules": {"type": "must be a list of readiness checks"},
        },
        "Failover readiness: the checks whose missing proof the operator accepts (baselines, "
        "trainer, drill, wakeMemory); each reads as accepted, not as a risk, while it fails or "
        "is unknown. A wake that would not fit in free memory is never accepted.",
        within="readiness",
    )
    # Adapter retention (fleets/reconciler/adapters.py): a routed version is always kept.
    adapter_keep_versions: int = _key(
        5,
        _bounded(
            "integer",
            {"minimum": 1, "maximum": 100},
            type_rule="must be an integer between 1 and 100",
        ),
        "Adapters: the newest this many registered versions of each adapter name are kept on "
        "every domain besides the routed ones; older ones are unloaded, deleted and retired.",
    )
    # /metrics exports it beside the measured p95.
    rto_ms: int = _key(
        300_000,
        TIMEOUT,
        "The recovery time objective: the p95 failover time (detection to routing moved) the "
        "fleet promises; an alert fires when the measured p95 drifts above it.",
    )
    # Data-path detection (fleets.reconciler.datapath).
    serving_check_timeout_ms: int = _key(
        500,
        _ms_between(50, 10_000),
        "Bound of a direct check of a model server (GET <servingUrl>/health) when its "
        "supervisor cannot vouch for it, and of each call of a data-path confirmation.",
    )
    # One refused connection is not an outage.
    data_path_confirm_interval_ms: int = _key(
        200,
        _ms_between(10, 10_000),
        "An active a proxy could not reach is failed only when its supervisor and every model "
        "server refuse connections on two checks this far apart.",
    )

    # Adapter rollouts (fleets/core/adapter_rollout.py): the plan a new adapter version gets
    # when it goes out on its own, or when a request names no steps or gates. Kept together in
    # one block (the registry's adapter keys sit in their own).
    adapter_rollout_auto: bool = _key(
        True,
        SWITCH,
        "Start an adapter rollout on its own when a newer version of a routed adapter is "
        "probed on the active (a pinned route is left alone; a version rolled back once is "
        "never started again on its own).",
        within="adapterRollout",
    )
    adapter_rollout_steps: tuple[Any, ...] = _key(
        DEFAULT_ADAPTER_STEPS,
        {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_STEPS,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["weight"],
                "properties": {
                    "weight": {"type": "integer", "minimum": 1, "maximum": 100},
                    "dwellS": {"type": "integer", "minimum": 0, "maximum": MAX_DWELL_S},
                },
                "x-rules": {"type": "must be an object {weight, dwellS}"},
            },
            "x-rules": {
                "type": "must be a list of {weight, dwellS}",
                "minItems": "must name at least one step",
                "maxItems": f"at most {MAX_STEPS} steps",
            },
        },
        "An adapter rollout's weight steps: percents of the adapter's requests to the new "
        "version, strictly increasing, the last 100, each held dwellS seconds (gates passing).",
        within="adapterRollout",
    )
    adapter_rollout_gates: Any = _key(
        None,
        {
            "type": ["object", "null"],
            "additionalProperties": False,
            "properties": {
                "maxErrorRateDelta": {"type": "number", "minimum": 0, "maximum": 1},
                "ttftP95Ratio": {"type": "number", "minimum": 1, "maximum": 100},
                "itlP95Ratio": {"type": "number", "minimum": 1, "maximum": 100},
                "minSamples": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
                "windowS": {"type": "integer", "minimum": 5, "maximum": 3600},
            },
            "x-rules": {"type": "must be an object of rollout gates, or null"},
        },
        "An adapter rollout's gates (the rollout gates' keys); null: the rollouts' defaults.",
        within="adapterRollout",
    )
    adapter_rollout_prepare_timeout_ms: int = _key(
        DEFAULT_PREPARE_TIMEOUT_MS,
        _ms_between(60_000, 24 * 3_600_000),
        "How long an adapter rollout waits for its version's copy on the active to be probed "
        "before it gives up (rolled back, nothing routed).",
        within="adapterRollout",
    )
    adapter_rollout_sticky_header: str = _key(
        "",
        {
            "type": "string",
            "maxLength": 64,
            "pattern": "^([!#$%&'*+.^_`|~0-9a-z-]{1,64})?$",
            "x-rules": {
                "type": "must be a string",
                "maxLength": "must be at most 64 characters",
                "pattern": "must be a lower-case header name or empty",
            },
        },
        "The request header an automatic adapter rollout keeps each caller on one version by "
        "(a session or user id your clients send); empty: the caller's API key.",
        within="adapterRollout",
    )

    @classmethod
    def resolve(cls, raw: Mapping[str, Any] | None) -> Policy:
        """Validate the stored operator keys and fill every unset key from `DEFAULTS`."""
        given = _validated(raw if raw is not None else {})
        return cls(
            **{
                key.field: _held(
                    (given.get(key.within, {}) if key.within else given).get(key.name, key.default)
                )
                for key in KEYS
            }
        )

    def training_stop_grace(self, *, outage: bool) -> int:
        """SIGTERM to SIGKILL for trainers stopped for a promotion; `outage`: a failover."""
        return self.failover_training_stop_grace_ms if outage else self.training_stop_grace_ms

    def to_json(self) -> dict[str, Any]:
        """Return the resolved policy in the public camelCase shape of `DEFAULTS`."""
        return _public((key, getattr(self, key.field)) for key in KEYS)

    def step_timeout_ms(self, step: str) -> int:
        """Return the time budget of an operation step; raise ValueError for an unknown step."""
        # A round-trip drill's second leg runs the promotion's steps under the same budgets.
        name = _STEP_TIMEOUT_FIELDS.get(leg_step(step))
        if name is None:
            raise ValueError(f"unknown step {step!r}")
        budget: int = getattr(self, name)
        return budget


@dataclass(frozen=True)
class PolicyKey:
    """A row of the policy table, as read from the Policy field that declares it."""

    field: str  # the Policy attribute
    name: str  # the public camelCase key (inside `within`, when that is set)
    within: str  # the public object the key sits in (`probe`), or ""
    default: Any
    schema: dict[str, Any]  # the key's JSON Schema: type, bounds and the rules' words
    doc: str
    steps: tuple[Step, ...]  # the operation steps whose time budget it is

    @property
    def documented_schema(self) -> dict[str, Any]:
        """The key's schema with what it means and its default (annotations: never a rule)."""
        return {**self.schema, "description": self.doc, "default": self.default}

    @property
    def dotted(self) -> str:
        """The key's path in the public JSON (`probe.maxTokens`)."""
        return f"{self.within}.{self.name}" if self.within else self.name


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(word.capitalize() for word in rest)


def _snake(camel: str) -> str:
    """`adapterRollout` -> `adapter_rollout`: a group's fields start with its snake name."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)


def _public_value(value: Any) -> Any:
    """A value as the public JSON holds it: a tuple (what a frozen Policy holds) is a list."""
    return list(value) if isinstance(value, tuple) else value


def _held(value: Any) -> Any:
    """A value as the frozen Policy holds it: a list is a tuple."""
    return tuple(value) if isinstance(value, list) else value


KEYS: tuple[PolicyKey, ...] = tuple(
    PolicyKey(
        field=f.name,
        name=_camel(f.name.removeprefix(f"{_snake(f.metadata['within'])}_")),
        within=f.metadata["within"],
        default=_public_value(f.default),
        schema=f.metadata["schema"],
        doc=f.metadata["doc"],
        steps=f.metadata["steps"],
    )
    for f in fields(Policy)
)
# Which Policy field bounds each operation step.
_STEP_TIMEOUT_FIELDS: dict[str, str] = {step: key.field for key in KEYS for step in key.steps}


def _public(values: Iterable[tuple[PolicyKey, Any]]) -> dict[str, Any]:
    """The public camelCase shape, in the table's order: a key `within` an object sits in it."""
    out: dict[str, Any] = {}
    for key, value in values:
        (out.setdefault(key.within, {}) if key.within else out)[key.name] = _public_value(value)
    return out


# A fleet's policy with nothing set.
DEFAULTS: dict[str, Any] = _public((key, key.default) for key in KEYS)


def policy_schema() -> dict[str, Any]:
    """The JSON Schema of an operator-written policy, from the table (`schemas/policy.json`)."""
    properties: dict[str, Any] = {}
    for key in KEYS:
        if key.within:
            group = properties.setdefault(
                key.within,
                {
                    "type": "object",
                    "x-rules": {"type": "must be an object"},
                    "additionalProperties": False,
                    "properties": {},
                },
            )
            group["properties"][key.name] = key.documented_schema
        else:
            properties[key.name] = key.documented_schema
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://haru.invalid/schemas/policy.json",
        "title": "Fleet policy",
        "description": (
            "The keys an operator sets; every unset key takes its default. Generated from the "
            "policy table (fleets/core/policy.py Policy): edit that, not this file. Semantic "
            "rules a schema cannot say (what PostgreSQL jsonb can store) are checked by "
            "validate_policy."
        ),
        "type": "object",
        "x-rules": {"type": "must be an object"},
        "additionalProperties": False,
        "properties": properties,
        "$defs": _DEFS,
    }


def policy_schema_text() -> str:
    """`policy_schema` as the shipped file holds it."""
    return json.dumps(policy_schema(), indent=2, ensure_ascii=False) + "\n"


@cache
def _validator() -> Any:
    return strict_validator(policy_schema())


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

    Structure and limits are `policy_schema`'s (unknown keys first, then the keys in
    `DEFAULTS` order, so the first error reported is deterministic); raise PolicyError naming
    the first offending field. Unset keys stay unset: the result is what gets stored, and
    defaults are applied on read by `Policy.resolve`.
    """
    validator = _validator()
    if not validator.is_valid(raw):  # the common case (every read of a stored policy) is valid
        raise PolicyError(*problems(validator, raw, path)[0])
    assert isinstance(raw, Mapping)  # the schema refuses anything else
    out: dict[str, Any] = {}
    for key in KEYS:  # stored in the policy table's order
        if key.within and key.within not in raw:
            continue
        given, into = (
            (raw[key.within], out.setdefault(key.within, {})) if key.within else (raw, out)
        )
        if key.name not in given:
            continue
        value = given[key.name]
        if key.schema.get("type") == "number":  # stored as the float it means: 1 is 1.0
            value = float(value)
        elif isinstance(value, str):
            _storable(value, f"{path}.{key.dotted}")
        into[key.name] = value
    _backoff_in_order(out, path)
    _adapter_steps_in_order(out, path)
    return out


def _adapter_steps_in_order(given: Mapping[str, Any], path: str) -> None:
    """Refuse adapter steps a rollout would refuse (not increasing, the last not 100)."""
    steps = given.get("adapterRollout", {}).get("steps")
    if steps is None:
        return
    try:
        steps_parse(steps)
    except RolloutInvalid as exc:
        raise PolicyError(f"{path}.adapterRollout.{exc.field}", exc.message) from None


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
