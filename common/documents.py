"""Operator documents checked by JSON Schema files, with every error in `path: rule` words.

One idiom for what operators write: a schema file shipped as package data says the structure
(types, ranges, unknown fields), and a small semantic pass in the owning module says what a
schema cannot. This module turns jsonschema's errors into the house's messages
(`policy.wakeTimeoutMs: must be between 1 and 2147483647`), so each document reads alike.

A schema may word its own rules: `x-rule` (one string) for a pattern, enum, const or maxLength,
or `x-rules` (keyword -> string) for any keyword (`required` and `additionalProperties`
included); the common keywords it does not word get the house's words, not jsonschema's
(which quote the whole value: `[...] is too long`). Shared limits are written once, in
`common/limits.py`: a schema names one as the string `"$limits.NAME"` where a number goes,
and as `{NAME}` inside a rule's words.

Standard library and jsonschema only (no Django): the control plane and the supervisor share it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from functools import cache
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

from common import limits
from common.strict_json import is_int, is_number, is_whole, type_name

_LIMIT_PREFIX = "$limits."
# Keywords that say what a value means and never what is valid.
_ANNOTATIONS = frozenset({"title", "description", "default", "examples"})


# Draft 2020-12 with the house's numbers: "integer" means `is_int` (jsonschema would take 1.0),
# "number" means `is_number` (it would take NaN from a Python caller). For what operators write.
StrictValidator = validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: is_int(value)
    ).redefine("number", lambda _checker, value: is_number(value)),
)
# The same for the supervisor wire (`common/wire/contract.py`), whose integer is a whole number
# (`is_whole`: 4.0 is 4, as JSON Schema and the original system read it); NaN is still refused.
WireValidator = validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: is_whole(value)
    ).redefine("number", lambda _checker, value: is_number(value)),
)


def _limit_values() -> dict[str, int]:
    return {
        name: value
        for name, value in vars(limits).items()
        if name.isupper() and isinstance(value, int)
    }


def with_limits(node: Any, *, in_rule: bool = False) -> Any:
    """Return `node` with every `"$limits.NAME"` and every `{NAME}` in a rule filled in."""
    if isinstance(node, dict):
        return {
            key: with_limits(value, in_rule=in_rule or key in {"x-rule", "x-rules"})
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [with_limits(item, in_rule=in_rule) for item in node]
    if isinstance(node, str) and node.startswith(_LIMIT_PREFIX):
        return _limit_values()[node.removeprefix(_LIMIT_PREFIX)]
    if isinstance(node, str) and in_rule:
        for name, value in _limit_values().items():
            node = node.replace(f"{{{name}}}", str(value))
    return node


def inline_refs(node: Any, root: dict[str, Any] | None = None, package: str | None = None) -> Any:
    """Replace every `{"$ref": "#/$defs/NAME"}` by its definition, and every
    `{"$ref": "OTHER.json"}` by that sibling schema file of `package` (itself inlined).

    jsonschema resolves a `$ref` on every validation, which costs several times the check
    itself; a policy is validated on every read of a fleet, so the shipped schema is resolved
    once, here. Only non-recursive references are used by the documents' schemas. A local
    reference may carry annotations beside it (`description`, `default`): they are kept.
    """
    root = node if root is None else root
    if isinstance(node, list):
        return [inline_refs(item, root, package) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    ref = ref if isinstance(ref, str) else ""
    annotations = {k: v for k, v in node.items() if k in _ANNOTATIONS}
    if ref.startswith("#/$defs/") and len(node) == 1 + len(annotations):
        definition = inline_refs(root["$defs"][ref.removeprefix("#/$defs/")], root, package)
        return {**definition, **annotations}
    if ref.endswith(".json") and "/" not in ref and len(node) == 1 and package is not None:
        other = _schema_text(package, ref.removesuffix(".json"))
        # A sibling's identity keys may only sit at a document's root.
        body = {k: v for k, v in other.items() if k not in {"$schema", "$id"}}
        return inline_refs(body, body, package)
    return {key: inline_refs(value, root, package) for key, value in node.items()}


def _schema_text(package: str, name: str) -> dict[str, Any]:
    text = resources.files(package).joinpath("schemas", f"{name}.json").read_text("utf-8")
    loaded: dict[str, Any] = with_limits(json.loads(text))
    return loaded


def strict_validator(
    schema: dict[str, Any], package: str | None = None, kind: Any = StrictValidator
) -> Any:
    """The strict validator (or the wire's, with `kind=WireValidator`) of a schema already
    read: shared limits filled in, references inlined (sibling files from `package`'s
    `schemas/`), the schema itself checked."""
    filled = inline_refs(with_limits(schema), package=package)
    kind.check_schema(filled)
    return kind(filled)


@cache
def schema_validator(package: str, name: str, kind: Any = StrictValidator) -> Any:
    """The validator of `<package>/schemas/<name>.json` (checked once, then cached)."""
    return strict_validator(_schema_text(package, name), package, kind)


def json_path(parts: Iterable[Any], prefix: str = "") -> str:
    """`slots[1].models[0].name` from jsonschema's path parts, under `prefix`."""
    out = prefix
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(root)"


def rule_of(error: ValidationError) -> str:
    """Turn a jsonschema error into the rule it broke, in the document's own words.

    A worded rule may quote what it got: `{got}` is the value's type in words ("a string"),
    `{value}` the value itself as JSON (`must be at least 1, got 0`).
    """
    return (
        _worded(error)
        .replace("{got}", type_name(error.instance))
        .replace("{value}", _as_json(error.instance))
    )


def _as_json(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


# A rule's wording, with the schema's value for {}.
_WORDING = {
    "type": "must be of type {}",
    "minimum": "must be at least {}",
    "maximum": "must be at most {}",
    "exclusiveMinimum": "must be greater than {}",
    "exclusiveMaximum": "must be less than {}",
    "maxLength": "must be at most {} characters",
    "minItems": "must have at least {} item(s)",
    "maxItems": "must have at most {} item(s)",
    "maxProperties": "must have at most {} entries",
}


def _worded(error: ValidationError) -> str:
    kind = error.validator
    schema = error.schema if isinstance(error.schema, dict) else {}
    worded = schema.get("x-rules", {}).get(kind)
    if worded:
        return str(worded)
    custom = schema.get("x-rule")
    if custom and kind in {"pattern", "enum", "const", "maxLength"}:
        return str(custom)
    template = _WORDING.get(kind)
    if template is not None:
        return template.format(error.validator_value)
    if kind == "minLength":
        return (
            "must not be empty"
            if error.validator_value == 1
            else f"must be at least {error.validator_value} characters"
        )
    if kind == "uniqueItems":
        return "must not repeat an entry"
    if kind == "const":
        return f"must be {_as_json(error.validator_value)}"
    if kind == "enum":
        return "must be one of " + ", ".join(_as_json(v) for v in error.validator_value)
    return str(error.message)


def findings(error: ValidationError, prefix: str = "") -> list[tuple[str, str]]:
    """Return the (path, rule) pairs of one jsonschema error, each naming the field at fault."""
    parts = list(error.absolute_path)
    if error.validator == "additionalProperties":
        # One finding per stray key, at the key's own path: `policy.autoFailver: unknown field`.
        extra = set(error.instance) - set(error.schema.get("properties", {}))
        rule = str(error.schema.get("x-rules", {}).get("additionalProperties", "unknown field"))
        return [(json_path([*parts, str(key)], prefix), rule) for key in sorted(extra, key=str)]
    if error.validator == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        rule = str(error.schema.get("x-rules", {}).get("required", "is required"))
        return [(json_path([*parts, key], prefix), rule) for key in missing]
    schema_path = list(error.relative_schema_path)
    if len(schema_path) >= 2 and schema_path[-2] == "additionalProperties" and parts:
        # A map's value is named by its key at the map's path (`env: value of "A" must be a
        # string`): keys are free text (environment names), which a dotted path would blur.
        key = parts.pop()
        return [(json_path(parts, prefix), f'value of "{key}" {rule_of(error)}')]
    return [(json_path(parts, prefix), rule_of(error))]


def messages(error: ValidationError, prefix: str = "") -> list[str]:
    """Return the `path: rule` lines of one jsonschema error."""
    return [f"{where}: {rule}" for where, rule in findings(error, prefix)]


def leaf_errors(errors: Iterable[ValidationError]) -> Iterator[ValidationError]:
    """Flatten if/then and $ref wrappers so each message points at the field that is wrong."""
    for error in errors:
        if error.context:
            yield from leaf_errors(error.context)
        else:
            yield error


def problems(validator: Any, document: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Every (path, rule) `document` breaks, in the schema's order (empty: valid)."""
    # A dict keeps the order and finds a repeat at once (a list scan made 20,000 errors take
    # minutes).
    found: dict[tuple[str, str], None] = {}
    for error in leaf_errors(validator.iter_errors(document)):
        found.update(dict.fromkeys(findings(error, prefix)))
    return list(found)
