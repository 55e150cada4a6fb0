"""Policy defaults, strict validation with JSON paths, resolution and step budgets."""

from __future__ import annotations

import copy

import pytest

from fleets.core.policy import DEFAULTS, Policy, PolicyError, validate_policy
from fleets.core.states import DEMOTE_STEPS, PROMOTE_STEPS

TIMEOUT_KEYS = [
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
    "failoverBackoffMs",
    "failoverBackoffMaxMs",
    "failoverTrainingStopGraceMs",
    "flapWindowMs",
    "flapHoldDownMs",
]


def _refused(raw, expected_path, rule_part, **kwargs):
    with pytest.raises(PolicyError) as err:
        validate_policy(raw, **kwargs)
    assert err.value.path == expected_path
    assert rule_part in err.value.rule
    assert str(err.value) == f"{expected_path}: {err.value.rule}"
    assert isinstance(err.value, ValueError)


def test_defaults_match_the_design():
    assert DEFAULTS == {
        "autoFailover": False,
        "restoreStandbyOnReturn": True,
        "heartbeatStaleMs": 30000,
        "standbyHeartbeatMs": 10000,
        "degradedGraceMs": 60000,
        "trainingStopGraceMs": 30000,
        "failoverTrainingStopGraceMs": 1,
        "stopTrainingTimeoutMs": 90000,
        "verifyGpuTimeoutMs": 30000,
        "wakeTimeoutMs": 120000,
        "probeTimeoutMs": 60000,
        "switchActiveTimeoutMs": 10000,
        "sleepTimeoutMs": 60000,
        "startTrainingTimeoutMs": 30000,
        "streamMigrationAfterMs": 0,
        "verifyGpuMaxUsedRatio": 0.25,
        "probe": {"prompt": "ping", "maxTokens": 4},
        "replaceFailedStandby": True,
        "replaceFailedActive": True,
        "replaceFailedGraceMs": 60000,
        "provisionTimeoutMs": 1800000,
        "provisionRetryBackoffMs": 30000,
        "stopMode": "down",
        "failoverBackoffMs": 15000,
        "failoverBackoffMaxMs": 300000,
        "flapWindowMs": 600000,
        "flapMaxFailovers": 2,
        "flapHoldDownMs": 30000,
        "checkpointMaxAgeMs": 3600000,
        "drillMaxAgeMs": 604800000,
        "readiness": {"acceptMissing": []},
        "adapterKeepVersions": 5,
        "rtoMs": 300000,
        "servingCheckTimeoutMs": 500,
        "dataPathConfirmIntervalMs": 200,
        "adapterRollout": {
            "auto": True,
            "steps": [
                {"weight": 5, "dwellS": 120},
                {"weight": 25, "dwellS": 300},
                {"weight": 50, "dwellS": 300},
                {"weight": 100, "dwellS": 60},
            ],
            "gates": None,
            "prepareTimeoutMs": 1800000,
            "stickyHeader": "",
        },
    }


def test_adapter_rollout_steps_are_refused_as_a_rollout_would_refuse_them():
    _refused(
        {"adapterRollout": {"steps": [{"weight": 50, "dwellS": 10}, {"weight": 20}]}},
        "policy.adapterRollout.steps[1].weight",
        "strictly increasing",
    )
    _refused(
        {"adapterRollout": {"steps": [{"weight": 50, "dwellS": 10}]}},
        "policy.adapterRollout.steps[0].weight",
        "the last step must be 100",
    )
    _refused(
        {"adapterRollout": {"gates": {"windowS": 1}}}, "policy.adapterRollout.gates.windowS", ""
    )


def test_flap_max_failovers_is_a_small_count_and_zero_switches_damping_off():
    assert validate_policy({"flapMaxFailovers": 0}) == {"flapMaxFailovers": 0}
    _refused({"flapMaxFailovers": -1}, "policy.flapMaxFailovers", "between 0 and 100")
    _refused({"flapMaxFailovers": 101}, "policy.flapMaxFailovers", "between 0 and 100")
    _refused({"flapMaxFailovers": 1.5}, "policy.flapMaxFailovers", "integer")


@pytest.mark.parametrize("key", ["replaceFailedStandby", "replaceFailedActive"])
def test_replace_switches_must_be_booleans(key):
    _refused({key: 1}, f"policy.{key}", "true or false")
    assert validate_policy({key: False}) == {key: False}


def test_stop_mode_is_down_or_stop():
    _refused({"stopMode": "terminate"}, "policy.stopMode", "down")
    assert Policy.resolve({"stopMode": "stop"}).stop_mode == "stop"


def test_failover_backoff_cap_must_not_be_below_its_first_step():
    _refused({"failoverBackoffMaxMs": 10_000}, "policy.failoverBackoffMaxMs", "(15000); got 10000")
    _refused({"failoverBackoffMs": 400_000}, "policy.failoverBackoffMaxMs", "(400000); got 300000")
    _refused(
        {"failoverBackoffMs": 5_000, "failoverBackoffMaxMs": 4_999},
        "policy.failoverBackoffMaxMs",
        "got 4999",
    )
    _refused({"failoverBackoffMs": 0}, "policy.failoverBackoffMs", "between 1 and")
    ok = {"failoverBackoffMs": 1_000, "failoverBackoffMaxMs": 1_000}
    assert validate_policy(ok) == ok
    resolved = Policy.resolve(ok)
    assert (resolved.failover_backoff_ms, resolved.failover_backoff_max_ms) == (1_000, 1_000)


def test_empty_policy_stores_nothing_and_resolves_to_defaults():
    assert validate_policy({}) == {}
    assert Policy.resolve({}) == Policy() == Policy.resolve(None)
    assert Policy().to_json() == DEFAULTS


def test_validation_returns_only_the_keys_the_operator_set():
    raw = {"autoFailover": True, "wakeTimeoutMs": 5000, "probe": {"maxTokens": 8}}
    assert validate_policy(raw) == raw


def test_partial_probe_keeps_the_other_probe_default():
    policy = Policy.resolve({"probe": {"maxTokens": 16}})
    assert (policy.probe_prompt, policy.probe_max_tokens) == ("ping", 16)
    assert Policy.resolve({"probe": {"prompt": "hi"}}).probe_max_tokens == 4


def test_resolve_maps_every_camel_case_key_to_its_field():
    raw = {
        "autoFailover": True,
        "restoreStandbyOnReturn": False,
        **{key: 1000 + i for i, key in enumerate(TIMEOUT_KEYS)},
        "verifyGpuMaxUsedRatio": 0.5,
        "probe": {"prompt": "hello", "maxTokens": 32},
        "replaceFailedStandby": False,
        "replaceFailedActive": False,
        "stopMode": "stop",
        "checkpointMaxAgeMs": 60000,
        "drillMaxAgeMs": 86400000,
        "readiness": {"acceptMissing": ["baselines", "trainer"]},
        "adapterKeepVersions": 2,
        "rtoMs": 45000,
        "servingCheckTimeoutMs": 750,
        "dataPathConfirmIntervalMs": 120,
        "flapMaxFailovers": 3,
        "streamMigrationAfterMs": 2500,
        "standbyHeartbeatMs": 20000,
        "adapterRollout": {
            "auto": False,
            "steps": [{"weight": 10, "dwellS": 30}, {"weight": 100, "dwellS": 0}],
            "gates": {"minSamples": 5},
            "prepareTimeoutMs": 120000,
            "stickyHeader": "x-session-id",
        },
    }
    policy = Policy.resolve(raw)
    assert policy.adapter_rollout_auto is False
    assert policy.adapter_rollout_prepare_timeout_ms == 120000
    assert policy.adapter_rollout_sticky_header == "x-session-id"
    assert policy.to_json() == raw
    assert policy.standby_heartbeat_ms == 20000
    assert policy.flap_max_failovers == 3
    assert (policy.checkpoint_max_age_ms, policy.drill_max_age_ms) == (60000, 86400000)
    assert policy.rto_ms == 45000
    assert policy.adapter_keep_versions == 2
    assert policy.readiness_accept_missing == ("baselines", "trainer")
    assert policy.heartbeat_stale_ms == 1000
    assert policy.restore_standby_on_return is False
    assert policy.start_training_timeout_ms == 1009
    assert policy.provision_timeout_ms == 1011
    assert policy.failover_training_stop_grace_ms == 1015
    assert (policy.training_stop_grace(outage=False), policy.training_stop_grace(outage=True)) == (
        1002,
        1015,
    )
    assert (policy.replace_failed_standby, policy.replace_failed_active) == (False, False)
    assert policy.verify_gpu_max_used_ratio == 0.5
    assert (policy.serving_check_timeout_ms, policy.data_path_confirm_interval_ms) == (750, 120)
    assert policy.stream_migration_after_ms == 2500


def test_to_json_is_a_fresh_copy_and_never_aliases_defaults():
    snapshot = copy.deepcopy(DEFAULTS)
    Policy().to_json()["probe"]["prompt"] = "changed"
    assert snapshot == DEFAULTS


def test_policy_is_frozen():
    with pytest.raises(AttributeError):
        Policy().auto_failover = True  # type: ignore[misc]


@pytest.mark.parametrize("raw", [None, [], "x", 3, True])
def test_policy_must_be_an_object(raw):
    _refused(raw, "policy", "must be an object")


def test_unknown_key_is_refused_with_its_path():
    _refused({"autoFailver": True}, "policy.autoFailver", "unknown field")


def test_error_path_uses_the_given_prefix():
    _refused({"wakeTimeoutMs": 0}, "layout.policy.wakeTimeoutMs", "between", path="layout.policy")


@pytest.mark.parametrize("value", [1, "true", 0, None])
def test_auto_failover_must_be_a_boolean(value):
    _refused({"autoFailover": value}, "policy.autoFailover", "true or false")


@pytest.mark.parametrize("key", TIMEOUT_KEYS)
@pytest.mark.parametrize(
    ("value", "rule"),
    [
        (0, "between 1 and 2147483647"),
        (-5, "between"),
        (2**31, "between"),
        (1.5, "integer"),
        (1000.0, "integer"),
        (True, "integer"),
        ("1000", "integer"),
        (None, "integer"),
    ],
)
def test_timeouts_must_be_integers_in_range(key, value, rule):
    _refused({key: value}, f"policy.{key}", rule)


@pytest.mark.parametrize("key", TIMEOUT_KEYS)
def test_timeout_bounds_are_inclusive(key):
    # The backoff's cap may not sit below its first step: move the other side out of the way.
    other = {"failoverBackoffMs": {"failoverBackoffMaxMs": 2**31 - 1}}.get(key, {})
    if key == "failoverBackoffMaxMs":
        other = {"failoverBackoffMs": 1}
    for value in (1, 2**31 - 1):
        raw = {key: value, **other}
        assert validate_policy(raw) == raw


@pytest.mark.parametrize("value", [0, 0.0, -0.1, 1.01, float("nan"), float("inf"), True, "0.5"])
def test_verify_gpu_ratio_must_be_in_zero_one(value):
    _refused({"verifyGpuMaxUsedRatio": value}, "policy.verifyGpuMaxUsedRatio", "")


def test_verify_gpu_ratio_accepts_one_and_normalizes_to_float():
    assert validate_policy({"verifyGpuMaxUsedRatio": 1}) == {"verifyGpuMaxUsedRatio": 1.0}
    assert isinstance(validate_policy({"verifyGpuMaxUsedRatio": 1})["verifyGpuMaxUsedRatio"], float)


def test_probe_must_be_an_object_without_unknown_keys():
    _refused({"probe": "ping"}, "policy.probe", "must be an object")
    _refused({"probe": {"promt": "x"}}, "policy.probe.promt", "unknown field")


@pytest.mark.parametrize("value", ["", "x" * 8193, 5, None])
def test_probe_prompt_must_be_a_string_of_1_to_8192_code_points(value):
    _refused({"probe": {"prompt": value}}, "policy.probe.prompt", "")


def test_probe_prompt_counts_code_points_not_bytes():
    prompt = "\U0001f600" * 8192  # 4 bytes each in UTF-8, one code point each
    assert validate_policy({"probe": {"prompt": prompt}}) == {"probe": {"prompt": prompt}}


@pytest.mark.parametrize(("value", "rule"), [("a\x00b", "NUL"), ("a\ud800", "surrogate")])
def test_probe_prompt_refuses_what_the_database_cannot_store(value, rule):
    _refused({"probe": {"prompt": value}}, "policy.probe.prompt", rule)


@pytest.mark.parametrize("value", [0, 257, 4.0, True, "4", None])
def test_probe_max_tokens_must_be_an_integer_1_to_256(value):
    _refused({"probe": {"maxTokens": value}}, "policy.probe.maxTokens", "between 1 and 256")


def test_probe_max_tokens_bounds_are_inclusive():
    assert validate_policy({"probe": {"maxTokens": 1}})["probe"] == {"maxTokens": 1}
    assert validate_policy({"probe": {"maxTokens": 256}})["probe"] == {"maxTokens": 256}


def test_resolve_refuses_a_bad_stored_policy():
    with pytest.raises(PolicyError, match="policy.heartbeatStaleMs"):
        Policy.resolve({"heartbeatStaleMs": "soon"})


def test_every_operation_step_has_its_budget():
    policy = Policy.resolve(
        {
            "stopTrainingTimeoutMs": 1,
            "verifyGpuTimeoutMs": 2,
            "wakeTimeoutMs": 3,
            "probeTimeoutMs": 4,
            "switchActiveTimeoutMs": 5,
            "sleepTimeoutMs": 6,
            "startTrainingTimeoutMs": 7,
        }
    )
    budgets = {step: policy.step_timeout_ms(step) for step in PROMOTE_STEPS + DEMOTE_STEPS}
    assert budgets == {
        "stop_training": 1,
        "verify_gpu": 2,
        "wake": 3,
        "probe": 4,
        "switch_route": 5,
        "demote_old_sleep": 6,
        "sleep": 6,
        "demote_old_train": 7,
        "start_training": 7,
    }


def test_unknown_step_has_no_budget():
    with pytest.raises(ValueError, match="unknown step"):
        Policy().step_timeout_ms("wake_vllm")


def test_restore_standby_on_return_must_be_a_boolean():
    _refused(
        {"restoreStandbyOnReturn": "yes"}, "policy.restoreStandbyOnReturn", "must be true or false"
    )


@pytest.mark.parametrize(
    ("key", "low", "high"),
    [("servingCheckTimeoutMs", 50, 10_000), ("dataPathConfirmIntervalMs", 10, 10_000)],
)
def test_data_path_keys_are_bounded(key, low, high):
    assert validate_policy({key: low}) == {key: low}
    assert validate_policy({key: high}) == {key: high}
    _refused({key: low - 1}, f"policy.{key}", f"must be between {low} and {high}")
    _refused({key: high + 1}, f"policy.{key}", f"must be between {low} and {high}")
    _refused({key: "200"}, f"policy.{key}", "must be an integer number of milliseconds")
    resolved = Policy.resolve({key: low})
    assert resolved.to_json()[key] == low


def test_readiness_accepts_only_the_checks_whose_proof_may_never_come():
    assert validate_policy({"readiness": {"acceptMissing": ["baselines", "trainer"]}}) == {
        "readiness": {"acceptMissing": ["baselines", "trainer"]}
    }
    # Without a viable standby there is nothing to fail over to: never acceptable.
    _refused(
        {"readiness": {"acceptMissing": ["standby"]}},
        "policy.readiness.acceptMissing[0]",
        "must be",
    )
    _refused({"readiness": {"acceptMissing": "drill"}}, "policy.readiness.acceptMissing", "list")
    _refused(
        {"readiness": {"acceptMissing": ["drill", "drill"]}},
        "policy.readiness.acceptMissing",
        "repeat",
    )


@pytest.mark.parametrize("value", [0, None, 1, 60_000])
def test_stream_migration_takes_milliseconds_and_null_switches_it_off(value):
    assert validate_policy({"streamMigrationAfterMs": value}) == {"streamMigrationAfterMs": value}
    assert Policy.resolve({"streamMigrationAfterMs": value}).stream_migration_after_ms == value


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        (-1, "must be between 0 and 2147483647"),
        (2**31, "must be between 0 and 2147483647"),
        (1.5, "must be an integer number of milliseconds, or null"),
        (True, "must be an integer number of milliseconds, or null"),
        ("5s", "must be an integer number of milliseconds, or null"),
    ],
)
def test_a_bad_stream_migration_bound_is_refused_with_its_path(value, rule):
    _refused({"streamMigrationAfterMs": value}, "policy.streamMigrationAfterMs", rule)
