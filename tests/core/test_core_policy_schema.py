"""The policy schema file: shared limits filled in from common/limits.py, strict numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from common import limits
from common.documents import (
    StrictValidator,
    problems,
    schema_validator,
    strict_validator,
    with_limits,
)
from fleets.core.policy import (
    DEFAULTS,
    KEYS,
    Policy,
    PolicyError,
    policy_schema,
    policy_schema_text,
    validate_policy,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_policy_schema_takes_its_limits_from_the_one_module_that_holds_them():
    schema = schema_validator("fleets.core", "policy").schema
    timeout = schema["$defs"]["timeout"]
    assert timeout["maximum"] == limits.MAX_MS
    assert timeout["x-rules"]["maximum"] == f"must be between 1 and {limits.MAX_MS}"
    probe = schema["properties"]["probe"]["properties"]
    assert probe["prompt"]["maxLength"] == limits.MAX_PROBE_PROMPT_CHARS
    assert probe["maxTokens"]["maximum"] == limits.MAX_PROBE_TOKENS


def test_a_limit_the_module_does_not_hold_is_refused_when_the_schema_loads():
    with pytest.raises(KeyError):
        with_limits({"maximum": "$limits.NO_SUCH_LIMIT"})


@pytest.mark.parametrize(("value", "valid"), [(1, True), (1.0, False), (True, False)])
def test_an_integer_is_an_int_and_not_a_bool_or_a_whole_float(value, valid):
    validator = StrictValidator({"type": "integer"})
    assert (problems(validator, value) == []) is valid


def test_every_problem_is_reported_in_the_schema_order_with_unknown_keys_first():
    found = problems(
        schema_validator("fleets.core", "policy"),
        {"wakeTimeoutMs": 0, "autoFailover": 1, "zzz": 1},
        "policy",
    )
    assert found == [
        ("policy.zzz", "unknown field"),
        ("policy.autoFailover", "must be true or false"),
        ("policy.wakeTimeoutMs", f"must be between 1 and {limits.MAX_MS}"),
    ]
    with pytest.raises(PolicyError) as err:
        validate_policy({"wakeTimeoutMs": 0, "autoFailover": 1, "zzz": 1})
    assert str(err.value) == "policy.zzz: unknown field"


def test_validated_keys_come_back_in_the_policy_tables_order():
    assert list(validate_policy({"stopMode": "stop", "autoFailover": True})) == [
        "autoFailover",
        "stopMode",
    ]


def test_the_shipped_schema_file_is_the_policy_tables_rendering():
    # Regenerate after changing the table: PYTHONPATH=. python -c "from fleets.core.policy
    # import policy_schema_text as t; print(t(), end='')" > fleets/core/schemas/policy.json
    shipped = (ROOT / "fleets" / "core" / "schemas" / "policy.json").read_text(encoding="utf-8")
    assert shipped == policy_schema_text()


def test_every_key_of_the_table_is_in_the_schema_the_defaults_and_the_json():
    schema = policy_schema()["properties"]
    rendered = Policy().to_json()
    for key in KEYS:
        assert key.doc, key.field
        if key.within:
            assert key.name in schema[key.within]["properties"]
            assert rendered[key.within][key.name] == DEFAULTS[key.within][key.name] == key.default
        else:
            assert key.name in schema
            assert rendered[key.name] == DEFAULTS[key.name] == key.default
    assert list(schema) == list(DEFAULTS) == list(rendered)
    assert len(DEFAULTS) == 36


def test_a_policy_problem_reads_the_same_from_the_file_and_from_the_table():
    bad = {"probe": {"maxTokens": 0}, "stopMode": "halt", "servingCheckTimeoutMs": 1}
    assert problems(schema_validator("fleets.core", "policy"), bad, "policy") == problems(
        strict_validator(policy_schema()), bad, "policy"
    )


def test_a_reference_keeps_the_meaning_and_default_written_beside_it():
    wake = schema_validator("fleets.core", "policy").schema["properties"]["wakeTimeoutMs"]
    assert wake["maximum"] == limits.MAX_MS  # the definition, inlined
    assert (wake["default"], wake["description"]) == (120_000, "Budget of wake.")
