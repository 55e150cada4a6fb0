"""Parse and validate a layout file into plain, normalized values.

Structure is checked by the shipped JSON Schema (`schema.json`) through the strict validator
every operator document uses (`common/documents.py`: an integer is never a bool or a whole
float); the rules a schema cannot say (uniqueness inside a domain, the declared active being in
the fleet, policy limits, a provisioned domain's settings, checked by its driver) are
checked here. Every error is `path: rule`, e.g.
`domains[1].slots[0].models[2].name: must be lowercase`.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from common.documents import problems, strict_validator
from common.strict_json import ConfigError as SupervisorConfigError
from common.wire import bounded_json
from fleets.base.errors import LayoutError
from fleets.core.policy import PolicyError, validate_policy
from fleets.core.states import Provider, SlotKind
from fleets.core.supervisor_tls import TLS, normal_pin, transport_problem
from fleets.core.urls import url_problem
from fleets.drivers.base import DriverSettingsError
from fleets.drivers.registry import builtin, provider_names
from fleets.layouts.planning import (
    MEMORY_KEYS,
    Placed,
    PlanInputError,
    UnitInput,
    count_refusals,
    expand_gpus,
    missing_need,
    placements,
    plan_units,
    planned_profile,
)
from supervisor.config import parse_config as parse_supervisor_config

SCHEMA_PATH = Path(__file__).with_name("schema.json")
# A model's golden-probe keys, kept as written in ModelBinding.golden.
GOLDEN_KEYS = ("deterministic", "adapters")


@dataclass
class ModelSpec:
    name: str
    serving_url: str
    profile: dict[str, Any]
    # What the layout asks for: memoryMiB / memoryFraction / exclusive / sleepResidueMiB.
    memory: dict[str, Any] = field(default_factory=dict)
    # The golden probe's settings: {deterministic?: false, adapters?: [...]}; empty: defaults.
    golden: dict[str, Any] = field(default_factory=dict)


@dataclass
class SlotSpec:
    kind: str
    gpu_index: int
    spec: dict[str, Any]
    models: list[ModelSpec] = field(default_factory=list)
    # Every GPU the slot spans (tensor parallel), its MIG instance, and what the plan granted.
    gpu_indices: list[int] = field(default_factory=list)
    mig_instance: str = ""
    allocation: dict[str, Any] = field(default_factory=dict)
    # Pinned to where it already runs (re-apply keeps placements), not by the operator.
    sticky: bool = False


@dataclass
class DomainSpec:
    slug: str
    display_name: str
    provider: str
    priority: int
    placement: dict[str, Any]
    supervisor_url: str
    serving_base_url: str
    slots: list[SlotSpec]
    # {gpus, placementPolicy, safetyMarginMiB} when the layout describes the domain's GPUs.
    gpu_layout: dict[str, Any] = field(default_factory=dict)
    # The slots as written, before planning (re-planned on re-apply to keep placements).
    unplanned: list[SlotSpec] = field(default_factory=list)
    # Launch settings of a domain Haru provisions itself; empty: static, or provisioned by hand.
    driver: dict[str, Any] = field(default_factory=dict)
    # How the supervisor is reached (fleets.core.supervisor_tls): tls or plain-http, and the
    # pin of its certificate in normal form ("": a CA is trusted instead).
    supervisor_transport: str = TLS
    supervisor_fingerprint: str = ""


@dataclass
class Layout:
    slug: str
    display_name: str
    policy: dict[str, Any]
    active_domain_slug: str | None
    domains: list[DomainSpec]


@cache
def _validator(definition: str | None = None) -> Any:
    """The strict validator of the layout, or of one of its `$defs` (the admin checks a domain's
    placement on its own)."""
    schema = json.loads(SCHEMA_PATH.read_text())
    if definition is not None:
        schema = {**schema["$defs"][definition], "$defs": schema["$defs"]}
    return strict_validator(schema)


def layout_schema() -> dict[str, Any]:
    """The layout schema as checked: every `$ref` inlined (read its rules, do not edit it)."""
    schema: dict[str, Any] = _validator().schema
    return schema


def schema_problems(document: Any, *, definition: str | None = None, prefix: str = "") -> list[str]:
    """Every `path: rule` the layout schema (or its `$defs` entry `definition`) finds."""
    return [
        f"{where}: {rule}" for where, rule in problems(_validator(definition), document, prefix)
    ]


class _StrictYamlLoader(yaml.SafeLoader):
    """YAML without aliases and without repeated keys.

    An alias is refused where it is met, before anything is expanded: a 969-byte anchor bomb
    otherwise grows to gigabytes. A repeated key is refused with its line, where PyYAML keeps
    the last value silently (`autoFailover: true` then `autoFailover: false` read as false).
    """

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed in a layout", mark
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str | int | float | bool):
                continue  # SafeLoader refuses unhashable keys itself
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# Defaults of the limits `seed_layout` reads from HARU_LAYOUT_MAX_BYTES and HARU_JSON_MAX_DEPTH.
LAYOUT_MAX_BYTES = 4 * 1024 * 1024


def not_utf8(path: Path, exc: UnicodeDecodeError) -> str:
    """Say where a file stops being UTF-8 (a latin-1 file, say), by line and byte."""
    line = exc.object[: exc.start].count(b"\n") + 1
    byte = exc.object[exc.start]
    return f"{path}: not UTF-8 (byte 0x{byte:02x} on line {line}); a layout must be saved as UTF-8"


def read_layout_file(
    path: str | Path,
    *,
    max_bytes: int = LAYOUT_MAX_BYTES,
    max_depth: int = bounded_json.DEFAULT_MAX_DEPTH,
) -> Any:
    """Read a JSON or YAML layout file; raise LayoutError naming the file when unreadable, too
    big, too deep, or when it repeats a key or uses a YAML alias."""
    p = Path(path)
    limit, depth = max_bytes, max_depth
    try:
        size = p.stat().st_size
        if size > limit:
            raise LayoutError([f"{p}: {size} bytes; a layout may be at most {limit}"])
        text = p.read_bytes().decode("utf-8")
    except OSError as exc:
        raise LayoutError([f"{p}: cannot read layout file ({exc.strerror})"]) from None
    except UnicodeDecodeError as exc:
        raise LayoutError([not_utf8(p, exc)]) from None
    kind = p.suffix.lstrip(".") or "JSON"
    try:
        if p.suffix in {".yaml", ".yml"}:
            data = yaml.load(text, Loader=_StrictYamlLoader)  # noqa: S506 - a SafeLoader
            bounded_json.check_tree(data, max_depth=depth)
            return data
        return bounded_json.loads(text, max_depth=depth)
    except RecursionError:
        raise LayoutError([f"{p}: not valid {kind} (nested deeper than {depth} levels)"]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise LayoutError([f"{p}: not valid {kind} ({exc.problem}{where})"]) from None
    except (ValueError, yaml.YAMLError) as exc:
        raise LayoutError([f"{p}: not valid {kind} ({exc})"]) from None


def _driver_errors(d: dict[str, Any], dpath: str) -> list[str]:
    """Check a domain's provider against the driver registry, then, for a provisioned domain,
    its settings (by its driver) and its supervisor config (by the supervisor's parser)."""
    provider = d.get("provider", Provider.STATIC)
    if provider not in provider_names():
        return [f"{dpath}.provider: must be one of {', '.join(provider_names())}"]
    if "driver" not in d:
        return []
    if provider == Provider.STATIC:
        return [
            f"{dpath}.driver: a static domain is never provisioned; drop driver or set provider"
        ]
    out = []
    try:
        builtin().get(provider).validate(
            placement=d.get("placement", {}), settings=d["driver"], path=f"{dpath}."
        )
    except DriverSettingsError as exc:
        out.extend(exc.messages)
        if any(where.startswith(f"{dpath}.driver") for where, _ in exc.problems):
            return out
    config = d["driver"].get("supervisorConfig")
    if config is None:
        return out
    try:
        # Relative paths resolve on the host; "/" only stands in for it here.
        parse_supervisor_config(config, cwd=Path("/"))
    except SupervisorConfigError as exc:
        where = f"{dpath}.driver.supervisorConfig"
        out.extend(
            f"{where}.{e}" if not e.startswith("(root)") else f"{where}{e[6:]}" for e in exc.errors
        )
    return out


def written_rows(data: Any) -> int:
    """The rows a layout document names (domains, slots, models), counted before it is
    checked: whatever is not a list or an object counts as nothing."""

    def items(node: Any, key: str) -> list[Any]:
        value = node.get(key) if isinstance(node, dict) else None
        return value if isinstance(value, list) else []

    return sum(
        1 + len(items(d, "slots")) + sum(len(items(s, "models")) for s in items(d, "slots"))
        for d in items(data, "domains")
    )


def rows_problem(rows: int, limit: int) -> str | None:
    """Why a layout of `rows` rows is refused under HARU_LAYOUT_MAX_ROWS, or None."""
    if rows <= limit:
        return None
    return (
        f"domains: the layout names {rows} rows (domains, slots and models), over the "
        f"limit of {limit} (HARU_LAYOUT_MAX_ROWS)"
    )


def parse_layout(data: Any, *, max_rows: int | None = None) -> Layout:
    """Validate `data` and return the normalized Layout; raise LayoutError listing the errors.

    With `max_rows`, a layout naming more rows is refused first, before it is checked or
    planned (the work of both grows with it).
    """
    too_many = None if max_rows is None else rows_problem(written_rows(data), max_rows)
    if too_many:
        raise LayoutError([too_many])
    errors = sorted(schema_problems(data))
    if errors:
        raise LayoutError(errors)
    errors = []
    try:
        policy = validate_policy(data.get("policy", {}), path="policy")
    except PolicyError as exc:
        errors.append(str(exc))
        policy = {}
    domains: list[DomainSpec] = []
    seen_domains: dict[str, str] = {}
    for di, d in enumerate(data["domains"]):
        dpath = f"domains[{di}]"
        _first_seen(seen_domains, d["slug"], dpath, "slug", f"domain {d['slug']!r}", errors)
        domains.append(_parse_domain(data, d, dpath, errors))
    active = data.get("activeDomainSlug")
    if active is not None and active not in seen_domains:
        errors.append(
            f"activeDomainSlug: {active!r} is not a domain of this fleet "
            f"(domains: {', '.join(seen_domains)})"
        )
    if errors:
        raise LayoutError(errors)
    return Layout(
        slug=data["slug"],
        display_name=data.get("displayName", ""),
        policy=policy,
        active_domain_slug=active,
        domains=domains,
    )


def _parse_domain(
    data: dict[str, Any], d: dict[str, Any], dpath: str, errors: list[str]
) -> DomainSpec:
    """One domain of the layout; its problems are appended to `errors` (the whole layout's:
    a domain is planned only while the layout has none)."""
    for key in ("supervisorUrl", "servingBaseUrl"):
        problem = url_problem(d.get(key, ""))
        if problem:
            errors.append(f"{dpath}.{key}: {problem}")
    errors.extend(_driver_errors(d, dpath))
    transport, pin = _supervisor_tls(d, dpath, errors)
    slots = _parse_slots(d, dpath, errors)
    gpu_layout: dict[str, Any] = {}
    unplanned: list[SlotSpec] = []
    if "gpus" in d:
        gpu_layout = _gpu_layout(data, d)
        unplanned = _copied(slots)
        if not errors:
            slots = plan_slots(gpu_layout, slots, dpath, errors)
    return DomainSpec(
        slug=d["slug"],
        display_name=d.get("displayName", ""),
        provider=d.get("provider", Provider.STATIC),
        priority=d.get("priority", 100),
        placement=dict(d.get("placement", {})),
        supervisor_url=d.get("supervisorUrl", ""),
        serving_base_url=d.get("servingBaseUrl", ""),
        slots=slots,
        gpu_layout=gpu_layout,
        unplanned=unplanned,
        driver=dict(d.get("driver", {})),
        supervisor_transport=transport,
        supervisor_fingerprint=pin,
    )


def _copied(slots: list[SlotSpec]) -> list[SlotSpec]:
    """The slots and their models with their own spec, profile and memory dicts: what
    `copy.deepcopy` gives for the values a layout holds, several times faster (20,000 models
    took it seconds)."""
    return [
        replace(
            s,
            spec=copy.deepcopy(s.spec),
            models=[
                replace(
                    m,
                    profile=copy.deepcopy(m.profile),
                    memory=dict(m.memory),
                    golden=copy.deepcopy(m.golden),
                )
                for m in s.models
            ],
            gpu_indices=list(s.gpu_indices),
            allocation=copy.deepcopy(s.allocation),
        )
        for s in slots
    ]


def _supervisor_tls(d: dict[str, Any], dpath: str, errors: list[str]) -> tuple[str, str]:
    """The domain's supervisor transport and pin (normal form); problems go to `errors`: an
    http:// URL beyond loopback not asked for as plain-http, a pin on an http:// URL, or either
    field on a domain whose driver makes and pins the certificate at each launch."""
    transport = d.get("supervisorTransport", TLS)
    raw_pin = d.get("supervisorFingerprint", "")
    provider = d.get("provider", Provider.STATIC)
    if "driver" in d and provider != Provider.STATIC and _ships_tls(provider):
        errors.extend(
            f"{dpath}.{key}: a {provider} domain's certificate is made and pinned by the "
            "control plane at each launch (always HTTPS); drop this field"
            for key in ("supervisorTransport", "supervisorFingerprint")
            if key in d
        )
        return TLS, ""
    problem = transport_problem(d.get("supervisorUrl", ""), transport, raw_pin)
    if problem is not None:
        errors.append(f"{dpath}.{problem[0]}: {problem[1]}")
        return transport, ""
    return transport, normal_pin(raw_pin)


def _ships_tls(provider: str) -> bool:
    """Whether the provider's driver makes and ships the host's TLS identity at each launch."""
    return provider in provider_names() and builtin().get(provider).ships_tls


def _gpu_layout(data: dict[str, Any], d: dict[str, Any]) -> dict[str, Any]:
    """The domain's GPUs as written (export gives the same file back); expanded when planning."""
    gpu_layout: dict[str, Any] = {"gpus": [dict(g) for g in d["gpus"]]}
    policy_name = d.get("placementPolicy", data.get("placementPolicy"))
    if policy_name is not None:
        gpu_layout["placementPolicy"] = policy_name
    if "safetyMarginMiB" in d:
        gpu_layout["safetyMarginMiB"] = d["safetyMarginMiB"]
    return gpu_layout


def _first_seen(
    seen: dict[Any, str], key: Any, path: str, field: str, what: str, errors: list[str]
) -> None:
    """Remember that `key` is first written at `path`; a second one is an error at its `field`
    naming `what` is duplicated and where it was first."""
    if key in seen:
        errors.append(f"{path}.{field}: duplicate {what} (also {seen[key]})")
    seen.setdefault(key, path)


def _parse_slots(d: dict[str, Any], dpath: str, errors: list[str]) -> list[SlotSpec]:
    """A domain's slots as written: one GPU and kind each, a model name once per domain."""
    planned = "gpus" in d
    slots: list[SlotSpec] = []
    seen_slots: dict[tuple[int, str], str] = {}
    seen_models: dict[str, str] = {}
    for si, s in enumerate(d.get("slots", [])):
        spath = f"{dpath}.slots[{si}]"
        index = s.get("gpuIndex")
        if index is None and not planned:
            errors.append(
                f"{spath}.gpuIndex: is required when the domain does not describe its gpus"
            )
            index = 0
        if index is not None:
            what = f"{s['kind']} slot on GPU {index}"
            _first_seen(seen_slots, (index, s["kind"]), spath, "gpuIndex", what, errors)
        pins = {"mig_instance": s.get("migInstance", "")}
        if s["kind"] == SlotKind.TRAINING:
            spec = {"command": list(s["command"]), "checkpointDir": s["checkpointDir"]}
            spec.update({extra: s[extra] for extra in ("memoryBudgetMiB", "gpuType") if extra in s})
            slots.append(SlotSpec(SlotKind.TRAINING, index, spec, **pins))
            continue
        models, index = _parse_models(d, s, spath, index, seen_models, errors)
        spec = {"sleepLevel": s.get("sleepLevel", 1)}
        spec.update({extra: s[extra] for extra in ("gpuType", "topology") if extra in s})
        slots.append(SlotSpec(SlotKind.INFERENCE, index, spec, models, **pins))
    return slots


def _parse_models(
    d: dict[str, Any],
    s: dict[str, Any],
    spath: str,
    index: Any,
    seen_models: dict[str, str],
    errors: list[str],
) -> tuple[list[ModelSpec], Any]:
    """An inference slot's models, and the slot's GPU (a profile naming its GPUs pins it)."""
    planned, managed = "gpus" in d, "driver" in d
    models = []
    for mi, m in enumerate(s["models"]):
        mpath = f"{spath}.models[{mi}]"
        what = f"model {m['name']!r} in domain {d['slug']!r}"
        _first_seen(seen_models, m["name"], mpath, "name", what, errors)
        problem = url_problem(m.get("servingUrl", ""))
        if problem:
            errors.append(f"{mpath}.servingUrl: {problem}")
        serving_url = m.get("servingUrl") or d.get("servingBaseUrl", "")
        # A provisioned domain learns its serving URL from the cluster it gets.
        if not serving_url and not managed:
            errors.append(f"{mpath}.servingUrl: required when the domain has no servingBaseUrl")
        profile = dict(m.get("profile", {}))
        first = _profile_first_gpu(profile)
        if planned and first is not None:
            # A profile copied from a host's config names its GPUs: honour it as a pin.
            if index is not None and index != first:
                errors.append(
                    f"{mpath}.profile.gpus: starts at GPU {first}, the slot's gpuIndex is {index}"
                )
            index = first
        memory = {k: m[k] for k in MEMORY_KEYS if k in m}
        if "memoryMiB" in memory and "memoryFraction" in memory:
            errors.append(f"{mpath}: give memoryMiB or memoryFraction, not both")
        golden = {k: m[k] for k in GOLDEN_KEYS if k in m}
        models.append(ModelSpec(m["name"], serving_url, profile, memory, golden))
    return models, index


def _profile_first_gpu(profile: dict[str, Any]) -> int | None:
    """Return the first GPU index a profile's `gpus` names (ints or {index}), else None."""
    gpus = profile.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        return None
    first = gpus[0].get("index") if isinstance(gpus[0], dict) else gpus[0]
    return first if isinstance(first, int) else None


def slot_units(slots: list[SlotSpec], prefix: str = "slots") -> list[UnitInput]:
    """Describe each slot as a placement unit, labelled so a refusal names it."""
    return [UnitInput.of_slot(f"{prefix}[{i}]", s, s.models) for i, s in enumerate(slots)]


def plan_slots(
    gpu_layout: dict[str, Any],
    slots: list[SlotSpec],
    dpath: str,
    errors: list[str],
    *,
    count: bool = True,
) -> list[SlotSpec]:
    """Place the slots on the domain's GPUs; merge units that share a target into one slot.

    Refusals are appended to `errors` as `domains[i].slots[j] (models) on GPU k: reason (...)`.
    """
    gpus, gpu_errors = expand_gpus(gpu_layout["gpus"])
    if gpu_errors:
        errors.extend(f"{dpath}.{e}" for e in gpu_errors)
        return slots
    units = slot_units(slots, f"{dpath}.slots")
    problems = missing_need(units)
    if problems:
        errors.extend(problems)
        return slots
    try:
        result = plan_units(
            gpus,
            units,
            policy=gpu_layout.get("placementPolicy", "binpack"),
            **(
                {"safety_margin_mib": gpu_layout["safetyMarginMiB"]}
                if "safetyMarginMiB" in gpu_layout
                else {}
            ),
        )
    except PlanInputError as exc:
        errors.append(f"{dpath}: {exc}")
        return slots
    if not result.ok:
        if count:  # a trial plan (keeping placements on re-apply) is not a refusal
            count_refusals(r.reason for r in result.refusals)
        errors.extend(
            f"{r.workload}: refused on {r.target}: {r.reason} ({r.detail})" for r in result.refusals
        )
        return slots
    return _merged_slots(units, slots, placements(result), errors)


def _merged_slots(
    units: list[UnitInput], slots: list[SlotSpec], where: dict[str, Placed], errors: list[str]
) -> list[SlotSpec]:
    """One slot per (GPU, kind) the plan placed units on, its models' profiles as planned."""
    merged: dict[tuple[int, str], SlotSpec] = {}
    for unit, slot in zip(units, slots, strict=True):
        placed = where[unit.label]
        key = (placed.gpu_indices[0], slot.kind)
        if key in merged and merged[key].mig_instance != (placed.mig or ""):
            errors.append(
                f"{unit.label}: lands on MIG instance {placed.mig!r} of GPU {key[0]}, which "
                f"already has a {slot.kind} slot on another instance; Haru addresses slots by "
                "GPU, so one inference and one training slot per physical GPU"
            )
            continue
        servers = placed.allocation.get("servers", {})
        models = [
            ModelSpec(
                m.name,
                m.serving_url,
                planned_profile(
                    m.profile, placed.gpu_indices, servers[m.name]["gpuMemoryUtilization"]
                ),
                m.memory,
                m.golden,
            )
            for m in slot.models
        ]
        pinned = slot.gpu_index is not None and not slot.sticky
        if key in merged:
            into = merged[key]
            into.models.extend(models)
            into.allocation.setdefault("servers", {}).update(servers)
            into.allocation["pinned"] = into.allocation["pinned"] and pinned
            continue
        merged[key] = SlotSpec(
            slot.kind,
            placed.gpu_indices[0],
            dict(slot.spec),
            models,
            gpu_indices=list(placed.gpu_indices),
            mig_instance=placed.mig or "",
            allocation={**placed.allocation, "pinned": pinned},
        )
    return [merged[k] for k in sorted(merged)]


def load_layout(
    path: str | Path,
    *,
    max_bytes: int = LAYOUT_MAX_BYTES,
    max_depth: int = bounded_json.DEFAULT_MAX_DEPTH,
    max_rows: int | None = None,
) -> Layout:
    """Read and validate a layout file (`max_rows`: see `parse_layout`)."""
    data = read_layout_file(path, max_bytes=max_bytes, max_depth=max_depth)
    return parse_layout(data, max_rows=max_rows)
