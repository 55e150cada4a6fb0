"""Admin forms for fleet layouts, with the layout loader's rules and errors on the right field.

The patterns and limits are read from the loader's own JSON Schema (`fleets/layouts/schema.json`)
and its errors worded the loader's way, and policy goes through
`fleets.core.policy.validate_policy`, so a layout edited here is one that `seed_layout` would
accept, and an export of it round-trips.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.forms.fields import InvalidJSONInput, JSONString
from django.forms.formsets import DELETION_FIELD_NAME

from common.wire import bounded_json
from fleets.base.conf import haru_settings
from fleets.base.errors import LayoutError
from fleets.core.drills import DrillSchedule, schedule_problems
from fleets.core.policy import PolicyError, validate_policy
from fleets.core.states import Provider, SlotKind
from fleets.core.supervisor_tls import TLS, normal_pin, transport_problem
from fleets.core.urls import (
    has_userinfo,
    supervisor_url_problem,
    url_problem,
    without_userinfo,
)
from fleets.drivers.base import DriverSettingsError
from fleets.drivers.registry import builtin, provider_names
from fleets.layouts.loader import layout_schema, parse_layout, schema_problems
from fleets.models import Domain, Fleet, ModelBinding, Slot
from fleets.services.layouts import layout_refused_by_rollout, rollout_holding_layout


def _marked_for_deletion(form: forms.BaseForm) -> bool:
    """Whether a formset form's DELETE box is ticked (Django's private `_should_delete_form`)."""
    return bool(form.cleaned_data.get(DELETION_FIELD_NAME, False))


def _def(name: str) -> dict:
    return layout_schema()["$defs"][name]


def _check_pattern(value: str, definition: dict) -> None:
    if len(value) > definition.get("maxLength", 10**6) or not re.search(
        definition["pattern"], value
    ):
        raise ValidationError(definition["x-rule"])


def validate_slug(value: str) -> None:
    """Apply the layout's slug rule: lowercase letters and digits, single hyphens, <= 63."""
    _check_pattern(value, _def("slug"))


def validate_url(value: str) -> None:
    """The layout's URL rules: http(s), no credentials, no query or fragment."""
    if value:
        _check_pattern(value, _def("url"))
        problem = url_problem(value)
        if problem:
            raise ValidationError(problem)


def refuse_during_rollout(form: forms.BaseForm, fleet_id: Any) -> None:
    """The layout apply's rule in the admin: no domain, slot or model of a fleet with a rollout
    in flight is added, changed or deleted (the rollout holds the standby and moves its
    binding); the form says why and nothing is saved."""
    if fleet_id is None or not form.has_changed():
        return
    rollout = rollout_holding_layout(fleet_id)
    if rollout is not None:
        form.add_error(None, layout_refused_by_rollout(rollout))


def _fleet_of_domain(domain_id: Any) -> Any:
    if domain_id is None:
        return None
    return Domain.objects.filter(pk=domain_id).values_list("fleet_id", flat=True).first()


class ShownWithoutCredentials(forms.ModelForm):
    """Show stored URLs (`url_fields`) without the credentials a row written before the rule
    may hold: the change form would print the password. The form then counts as changed, so
    saving it (an inline row too) stores the URL stripped."""

    url_fields: tuple[str, ...] = ()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.strips_credentials = False
        for name in self.url_fields:
            value = self.initial.get(name)
            if isinstance(value, str) and has_userinfo(value):
                self.initial[name] = without_userinfo(value)
                self.strips_credentials = True

    def has_changed(self) -> bool:
        return self.strips_credentials or super().has_changed()


def validate_supervisor_url(value: str) -> None:
    """The URL rules, plus HARU_SUPERVISOR_HOSTS: a supervisor token goes to allowed hosts only."""
    validate_url(value)
    problem = value and supervisor_url_problem(value, haru_settings().supervisor_hosts)
    if problem:
        raise ValidationError(problem)


def validate_model_name(value: str) -> None:
    """Apply the layout's model-name rule: lowercase, no whitespace (the routing key)."""
    _check_pattern(value, _def("model")["properties"]["name"])


def _checked(field: str, validate: Callable[[str], None]) -> Callable[[forms.BaseForm], str]:
    """A form's `clean_<field>`: the field's cleaned text ("" when empty), checked by `validate`
    (which raises ValidationError)."""

    def clean(form: forms.BaseForm) -> str:
        value = form.cleaned_data.get(field) or ""
        validate(value)
        return value

    return clean


def _gpu_bounds() -> tuple[int, int]:
    spec = _def("inferenceSlot")["properties"]["gpuIndex"]
    return spec["minimum"], spec["maximum"]


class PrettyJSONField(forms.JSONField):
    """A JSON textarea that shows stored values indented, for people to read and edit."""

    def __init__(self, *args, rows: int = 8, cols: int = 70, **kwargs):
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": rows, "cols": cols}))
        super().__init__(*args, **kwargs)

    def to_python(self, value):
        # Django's own parse lets RecursionError through (a 500 for '[' * 100000) and keeps
        # the last of two repeated keys silently; the bounded parser refuses both, by path.
        if self.disabled or value in self.empty_values:
            return super().to_python(value)
        if isinstance(value, list | dict | int | float | JSONString):
            return value
        try:
            converted = bounded_json.loads(value, max_depth=haru_settings().json_max_depth)
        except ValueError as exc:
            raise ValidationError(f"Enter valid JSON: {exc}", code="invalid") from None
        return JSONString(converted) if isinstance(converted, str) else converted

    def bound_data(self, data, initial):
        if self.disabled:
            return initial
        if data is None:
            return None
        try:
            return bounded_json.loads(data, max_depth=haru_settings().json_max_depth)
        except ValueError:
            return InvalidJSONInput(data)

    def prepare_value(self, value):
        if isinstance(value, str) or value is None:
            return super().prepare_value(value)
        return json.dumps(value, indent=2, sort_keys=False, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# Fleet
# ---------------------------------------------------------------------------------------------


class FleetForm(forms.ModelForm):
    policy = PrettyJSONField(
        required=False,
        rows=16,
        help_text=(
            'Operator-set keys only, e.g. {"autoFailover": true, "wakeTimeoutMs": 60000}. '
            "Unset keys use the defaults (docs/layouts.md, 'Policy')."
        ),
    )

    class Meta:
        model = Fleet
        fields = [
            "slug",
            "display_name",
            "policy",
            "drill_interval_minutes",
            "drill_window_start",
            "drill_window_end",
            "drill_mode",
        ]

    def clean(self):
        data = super().clean() or {}
        schedule = DrillSchedule(
            data.get("drill_interval_minutes"),
            data.get("drill_window_start"),
            data.get("drill_window_end"),
        )
        problems = schedule_problems(schedule)
        if problems:
            raise ValidationError(problems)
        return data

    clean_slug = _checked("slug", validate_slug)

    def clean_policy(self):
        raw = self.cleaned_data.get("policy")
        try:
            # Store the normalized operator keys, exactly what the layout loader stores.
            return validate_policy({} if raw in (None, "") else raw)
        except PolicyError as exc:
            raise ValidationError(str(exc)) from None


# ---------------------------------------------------------------------------------------------
# Domain
# ---------------------------------------------------------------------------------------------


class DomainForm(ShownWithoutCredentials):
    placement = PrettyJSONField(
        required=False,
        rows=7,
        help_text='{"cloud", "region", "zones", "fallbackRegions", "accelerator", '
        '"acceleratorCount", "useSpot", "diskSizeGb", "image"}',
    )
    driver = PrettyJSONField(
        required=False,
        rows=9,
        help_text="a driver's provider only: how Haru launches it (docs/drivers.md); empty: "
        "provisioned by hand",
    )
    provider = forms.ChoiceField(
        choices=lambda: [(name, name) for name in provider_names()],
        initial=Provider.STATIC,
        help_text="static, or the driver that provisions it (docs/drivers.md)",
    )
    # Longer than the stored form: openssl's AB:CD:... form is accepted and normalized.
    supervisor_fingerprint = forms.CharField(
        required=False,
        max_length=110,
        help_text="sha256:<hex> of the supervisor's certificate (python -m supervisor "
        "tls-fingerprint on its host), trusted instead of a CA; empty: a CA",
    )
    gpu_layout = PrettyJSONField(
        required=False,
        rows=5,
        help_text='{"gpus": [{"count", "type", "memoryMiB", ...}], "placementPolicy", '
        '"safetyMarginMiB"}; empty to place slots by hand',
    )

    url_fields = ("supervisor_url", "serving_base_url")

    class Meta:
        model = Domain
        fields = [
            "slug",
            "display_name",
            "provider",
            "priority",
            "placement",
            "driver",
            "supervisor_url",
            "supervisor_transport",
            "supervisor_fingerprint",
            "serving_base_url",
            "gpu_layout",
        ]
        help_texts = {
            "supervisor_transport": "tls: https:// beyond loopback; plain-http: an http:// URL "
            "beyond loopback, the token in clear (docs/supervisor.md, TLS)",
        }

    def clean_gpu_layout(self):
        """Check the GPU description with the layout schema's own rules."""
        value = self.cleaned_data.get("gpu_layout") or {}
        if not value:
            return {}
        if not isinstance(value, dict) or set(value) - {
            "gpus",
            "placementPolicy",
            "safetyMarginMiB",
        }:
            raise ValidationError("keys: gpus, placementPolicy, safetyMarginMiB")
        probe = {"slug": "x", "domains": [{"slug": "x", **value, "slots": []}]}
        try:
            parse_layout(probe)
        except LayoutError as exc:
            raise ValidationError([e.replace("domains[0].", "") for e in exc.errors]) from None
        return value

    clean_slug = _checked("slug", validate_slug)

    clean_supervisor_url = _checked("supervisor_url", validate_supervisor_url)
    clean_serving_base_url = _checked("serving_base_url", validate_url)

    def clean_priority(self):
        value = self.cleaned_data.get("priority")
        spec = _def("domain")["properties"]["priority"]
        if value is not None and not spec["minimum"] <= value <= spec["maximum"]:
            raise ValidationError(f"must be between {spec['minimum']} and {spec['maximum']}")
        return value

    def clean_placement(self):
        value = self.cleaned_data.get("placement")
        value = {} if value in (None, "") else value
        errors = schema_problems(value, definition="placement", prefix="placement")
        if errors:
            raise ValidationError(errors)
        return value

    def clean_driver(self):
        value = self.cleaned_data.get("driver")
        return {} if value in (None, "") else value

    def clean(self):
        super().clean()
        data = self.cleaned_data  # what ModelForm.clean returns, typed
        driver = data.get("driver")
        if driver:
            # The same rules as the layout loader: a launch Haru cannot make is refused here.
            provider = data.get("provider") or Provider.STATIC
            try:
                if provider == Provider.STATIC:
                    raise DriverSettingsError("driver", "a static domain is never provisioned")
                builtin().get(provider).validate(
                    placement=data.get("placement") or {}, settings=driver
                )
            except DriverSettingsError as exc:
                field = "placement" if exc.path.startswith("placement") else "driver"
                self.add_error(field, str(exc))
        self._check_supervisor_tls(data)
        fleet = data.get("fleet")  # the admin's add form names it; an edit or inline has it set
        refuse_during_rollout(self, fleet.pk if fleet is not None else self.instance.fleet_id)
        return data

    def _check_supervisor_tls(self, data: dict[str, Any]) -> None:
        """The layout's rule (fleets.core.supervisor_tls) on the URL, transport and pin, each
        read from the form, else from the row (an inline form shows the URL alone)."""
        row = self.instance
        # The fields this form saves: a declared field is in every form, an inline's Meta
        # names only the ones it shows and saves.
        saved = {f for f in self.fields if self._meta.fields is None or f in self._meta.fields}

        def value(field: str) -> str:
            if field in saved:
                return data.get(field) or ""
            return getattr(row, field) or ""

        url, transport = value("supervisor_url"), value("supervisor_transport") or TLS
        try:
            pin = normal_pin(value("supervisor_fingerprint"))
        except ValueError as exc:
            self.add_error("supervisor_fingerprint", str(exc))
            return
        problem = transport_problem(url, transport, pin)
        if problem is not None:
            field = _SUPERVISOR_TLS_FIELDS[problem[0]]
            self.add_error(field if field in saved else None, problem[1])
        elif "supervisor_fingerprint" in saved:
            data["supervisor_fingerprint"] = pin


# The layout's name of each field fleets.core.supervisor_tls may name, as the form's.
_SUPERVISOR_TLS_FIELDS = {
    "supervisorUrl": "supervisor_url",
    "supervisorTransport": "supervisor_transport",
    "supervisorFingerprint": "supervisor_fingerprint",
}


class DomainInlineFormSet(forms.BaseInlineFormSet):
    """Unique slugs within the fleet (error on the slug), and the active domain stays."""

    def clean(self):
        # Our checks first: they put the error on the field; Django's own duplicate check then
        # finds nothing left to complain about in a formset-wide message.
        seen: dict[str, int] = {}
        for i, form in enumerate(self.forms):
            if not hasattr(form, "cleaned_data") or not form.cleaned_data:
                continue
            if self.can_delete and _marked_for_deletion(form):
                pointer = getattr(self.instance, "active_domain_id", None)
                if form.instance.pk and form.instance.pk == pointer:
                    form.add_error(
                        None,
                        f"{form.instance.slug} is the active domain: promote another domain "
                        "before deleting it",
                    )
                continue
            slug = form.cleaned_data.get("slug")
            if slug in seen:
                form.add_error("slug", f"duplicate domain {slug!r} (also row {seen[slug] + 1})")
            elif slug:
                seen[slug] = i
        super().clean()


# ---------------------------------------------------------------------------------------------
# Slots and model bindings
# ---------------------------------------------------------------------------------------------


class SlotForm(forms.ModelForm):
    """A slot's kind-specific spec as fields: training gets its command and checkpoint dir."""

    command = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 40, "class": "mono"}),
        help_text="training only: one argument per line, run exactly as written",
    )
    checkpoint_dir = forms.CharField(required=False, help_text="training only")

    class Meta:
        model = Slot
        fields = ["gpu_index", "kind"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        spec = self.instance.spec if self.instance and isinstance(self.instance.spec, dict) else {}
        # UUID primary keys are set before the first save: "adding" is what tells a new row.
        if not self.instance._state.adding and self.instance.kind == SlotKind.TRAINING:
            self.initial.setdefault("command", "\n".join(spec.get("command", [])))
            self.initial.setdefault("checkpoint_dir", spec.get("checkpointDir", ""))

    def clean_gpu_index(self):
        value = self.cleaned_data.get("gpu_index")
        low, high = _gpu_bounds()
        if value is not None and not low <= value <= high:
            raise ValidationError(f"must be between {low} and {high}")
        return value

    def clean_kind(self):
        kind = self.cleaned_data.get("kind")
        if not self.instance._state.adding and kind != self.instance.kind:
            # Each kind has its own state table; a slot cannot carry its state across.
            raise ValidationError(
                "the kind of an existing slot cannot change; delete it and add a new slot"
            )
        return kind

    def clean(self):
        super().clean()
        data = self.cleaned_data  # what ModelForm.clean returns, typed
        if data.get("kind") == SlotKind.TRAINING:
            command = [line.strip() for line in (data.get("command") or "").splitlines()]
            command = [c for c in command if c]
            if not command:
                self.add_error("command", "a training slot needs a command")
            if not (data.get("checkpoint_dir") or "").strip():
                self.add_error("checkpoint_dir", "a training slot needs a checkpoint directory")
            data["spec"] = {
                "command": command,
                "checkpointDir": (data.get("checkpoint_dir") or "").strip(),
            }
        elif data.get("kind") == SlotKind.INFERENCE:
            data["spec"] = {"sleepLevel": 1}  # level-1 sleep is the only supported level
        refuse_during_rollout(self, _fleet_of_domain(self.instance.domain_id))
        return data

    def save(self, commit=True):
        if "spec" in self.cleaned_data:
            self.instance.spec = self.cleaned_data["spec"]
        return super().save(commit)


class SlotInlineFormSet(forms.BaseInlineFormSet):
    """At most one slot per (GPU, kind) in a domain, reported on the GPU index."""

    def clean(self):
        seen: dict[tuple[int, str], int] = {}
        for i, form in enumerate(self.forms):
            if not getattr(form, "cleaned_data", None) or _marked_for_deletion(form):
                continue
            key = (form.cleaned_data.get("gpu_index"), form.cleaned_data.get("kind"))
            if None in key:
                continue
            if key in seen:
                form.add_error(
                    "gpu_index",
                    f"a {key[1]} slot on GPU {key[0]} already exists (row {seen[key] + 1})",
                )
            else:
                seen[key] = i
        super().clean()


class ModelBindingForm(ShownWithoutCredentials):
    profile = PrettyJSONField(
        required=False,
        rows=3,
        cols=44,
        help_text="engine profile (engine, modelPath, tensorParallel, ...) the supervisor "
        "fingerprints; leave empty when unknown",
    )
    serving_url = forms.CharField(
        required=False,
        max_length=500,
        help_text="defaults to the domain's serving base URL",
    )
    memory = PrettyJSONField(
        required=False,
        rows=2,
        cols=44,
        help_text='planned domains: {"memoryMiB" or "memoryFraction", "exclusive", '
        '"sleepResidueMiB"}',
    )

    url_fields = ("serving_url",)

    class Meta:
        model = ModelBinding
        fields = ["name", "slot", "serving_url", "profile", "memory"]

    def clean(self):
        data = super().clean()
        refuse_during_rollout(self, _fleet_of_domain(self.instance.domain_id))
        return data

    def clean_memory(self):
        value = self.cleaned_data.get("memory") or {}
        allowed = {"memoryMiB", "memoryFraction", "exclusive", "sleepResidueMiB"}
        if not isinstance(value, dict) or set(value) - allowed:
            raise ValidationError(f"keys: {', '.join(sorted(allowed))}")
        return value

    clean_name = _checked("name", validate_model_name)

    def clean_slot(self):
        slot = self.cleaned_data.get("slot")
        if slot is not None and slot.kind != SlotKind.INFERENCE:
            raise ValidationError("models bind to inference slots only")
        if (
            slot is not None
            and self.instance.domain_id
            and slot.domain_id != self.instance.domain_id
        ):
            raise ValidationError("choose a slot of this domain")
        return slot

    def clean_profile(self):
        value = self.cleaned_data.get("profile")
        if value in (None, ""):
            return {}
        if not isinstance(value, dict):
            raise ValidationError("must be a JSON object")
        return value

    def clean_serving_url(self):
        value = (self.cleaned_data.get("serving_url") or "").strip()
        if not value:
            domain = getattr(self.instance, "domain", None) if self.instance.domain_id else None
            value = domain.serving_base_url if domain else ""
        if not value:
            raise ValidationError("required when the domain has no serving base URL")
        validate_url(value)
        return value


class ModelBindingInlineFormSet(forms.BaseInlineFormSet):
    """Model names are unique within a domain, reported on the name field."""

    def add_fields(self, form, index):
        super().add_fields(form, index)
        # Only this domain's inference slots can hold its models.
        form.fields["slot"].queryset = Slot.objects.filter(
            domain=None if self.instance._state.adding else self.instance,
            kind=SlotKind.INFERENCE,
        ).order_by("gpu_index")

    def clean(self):
        seen: dict[str, int] = {}
        for i, form in enumerate(self.forms):
            if not getattr(form, "cleaned_data", None) or _marked_for_deletion(form):
                continue
            name = form.cleaned_data.get("name")
            if name in seen:
                form.add_error(
                    "name",
                    f"duplicate model {name!r} in domain {self.instance.slug!r} "
                    f"(also row {seen[name] + 1})",
                )
            elif name:
                seen[name] = i
        super().clean()
