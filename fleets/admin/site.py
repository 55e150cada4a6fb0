"""Django admin for fleet layouts, and a read-only view of operations and events.

Layout fields (slugs, URLs, placement, policy, slots, models) are editable with the layout
loader's validation. The routing pointer, the revision and every state field are read-only: they
move only through operations. The actions (promote, demote, reconcile, cancel an operation) call
the same services as the API, after a confirmation page.
"""

from __future__ import annotations

import json

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from fleets.admin import forms as af
from fleets.base import clock
from fleets.base.errors import ServiceError
from fleets.core.policy import Policy
from fleets.core.states import (
    DomainRole,
    OperationKind,
)
from fleets.dashboard import actions as dashboard_actions
from fleets.models import (
    Domain,
    Event,
    Fleet,
    FleetArchive,
    GoldenBaseline,
    ModelBinding,
    Operation,
    Slot,
)
from fleets.reads.selectors import operation_in_flight
from fleets.services.events import event_record
from fleets.services.fleets import fleet_delete
from fleets.services.gpu_plan import domain_gpus_adopt, domain_plan, domain_plan_apply
from fleets.services.inventory import domain_add, slot_add
from fleets.services.layouts import layout_export


def _pretty_json(value) -> str:
    return format_html(
        '<pre style="white-space: pre-wrap; margin: 0">{}</pre>',
        json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False),
    )


def _actor(request) -> str:
    return f"admin:{request.user.get_username()}"


def _record_edit(request, fleet_id, what: str, changed: list[str]) -> None:
    """Audit a layout edit; the event also tells open dashboards to refresh."""
    event_record(
        fleet_id=fleet_id,
        kind="layout.edited",
        actor=_actor(request),
        data={"what": what, "changed": sorted(set(changed))[:50]},
    )


def _confirm(modeladmin, request, queryset, *, action: str, title: str, text: str):
    """Render the intermediate confirmation page of a state-moving admin action."""
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": title,
        "text": text,
        "objects": list(queryset),
        "action": action,
        "opts": modeladmin.model._meta,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
    }
    return TemplateResponse(request, "admin/fleets/confirm_action.html", context)


def _report(modeladmin, request, result: dashboard_actions.ActionResult, label: str) -> None:
    level = messages.SUCCESS if result.ok else messages.ERROR
    modeladmin.message_user(request, f"{label}: {result.message}", level)


# ---------------------------------------------------------------------------------------------
# Inlines
# ---------------------------------------------------------------------------------------------


class DomainInline(admin.StackedInline):
    model = Domain
    form = af.DomainForm
    formset = af.DomainInlineFormSet
    extra = 0
    show_change_link = True
    readonly_fields = ("role", "state", "last_seen_at")
    fields = (
        ("slug", "display_name"),
        ("provider", "priority"),
        "placement",
        ("supervisor_url", "serving_base_url"),
        ("role", "state", "last_seen_at"),
    )

    @admin.display(description="role")
    def role(self, obj):
        if obj is None or obj._state.adding:
            return "-"
        return DomainRole.ACTIVE if obj.fleet.active_domain_id == obj.pk else DomainRole.STANDBY


class SlotInline(admin.TabularInline):
    model = Slot
    form = af.SlotForm
    formset = af.SlotInlineFormSet
    extra = 0
    fields = ("gpu_index", "kind", "command", "checkpoint_dir", "state", "pids")
    readonly_fields = ("state", "pids")


class ModelBindingInline(admin.TabularInline):
    model = ModelBinding
    fk_name = "domain"
    form = af.ModelBindingForm
    formset = af.ModelBindingInlineFormSet
    extra = 0
    fields = ("name", "slot", "serving_url", "profile")


# ---------------------------------------------------------------------------------------------
# Fleet
# ---------------------------------------------------------------------------------------------


@admin.register(Fleet)
class FleetAdmin(admin.ModelAdmin):
    form = af.FleetForm
    inlines = [DomainInline]
    list_display = ("slug", "display_name", "active", "route_revision", "in_flight", "dashboard")
    search_fields = ("slug", "display_name")
    readonly_fields = (
        "id",
        "active",
        "route_revision",
        "resolved_policy",
        "created_at",
        "updated_at",
    )
    fieldsets = (
        (None, {"fields": ("slug", "display_name", "policy")}),
        (
            "Failover drills (check: the standby wakes and is probed, routing never moves; "
            "round_trip: promote the standby and back, routing moves twice)",
            {
                "fields": (
                    "drill_interval_minutes",
                    "drill_window_start",
                    "drill_window_end",
                    "drill_mode",
                )
            },
        ),
        (
            "Routing (moves only through operations)",
            {"fields": ("active", "route_revision")},
        ),
        (
            "Details",
            {
                "classes": ("collapse",),
                "fields": ("id", "resolved_policy", "created_at", "updated_at"),
            },
        ),
    )
    actions = ["reconcile_now", "run_drill", "record_baselines", "export_layout"]

    # Deleting goes through fleet_delete: refused while an operation is in flight, and the
    # fleet's operations and events are archived (FleetArchive) rather than lost. The stock
    # confirmation page would demand delete permission on operations and events, which are
    # read-only here on purpose; it lists them as archived instead.
    def get_deleted_objects(self, objs, request):
        fleets = list(objs)
        busy = [
            f"{f.slug}: {op.kind} of {op.target_slug} is in flight; wait for it or cancel it"
            for f in fleets
            if (op := operation_in_flight(f.id)) is not None
        ]
        summary = [
            format_html(
                "Fleet {} with {} domain(s); {} operation(s) and {} event(s) are archived, "
                "not lost (Fleet archives in this admin)",
                f.slug,
                Domain.objects.filter(fleet=f).count(),
                Operation.objects.filter(fleet=f).count(),
                Event.objects.filter(fleet=f).count(),
            )
            for f in fleets
        ]
        return summary, {"fleets": len(fleets)}, set(), busy

    def delete_model(self, request, obj):
        try:
            fleet_delete(fleet_id=obj.id, actor=_actor(request))
        except ServiceError as exc:
            self.message_user(request, exc.message, messages.ERROR)

    def delete_queryset(self, request, queryset):
        for fleet in queryset:
            self.delete_model(request, fleet)

    @admin.display(description="active domain")
    def active(self, obj):
        return obj.active_domain.slug if obj.active_domain_id else "-"

    @admin.display(description="in flight")
    def in_flight(self, obj):
        op = operation_in_flight(obj.id)
        return f"{op.kind} -> {op.target_slug} ({op.current_step or op.state})" if op else "-"

    @admin.display(description="dashboard")
    def dashboard(self, obj):
        return format_html('<a href="{}">open</a>', reverse("dashboard:fleet", args=[obj.slug]))

    @admin.display(description="policy with defaults")
    def resolved_policy(self, obj):
        return _pretty_json(Policy.resolve(obj.policy).to_json())

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if change and form.changed_data:
            _record_edit(request, obj.id, f"fleet {obj.slug}", form.changed_data)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        _replan(self, request, Domain.objects.filter(fleet=form.instance))

    def save_formset(self, request, form, formset, change):
        instances = formset.save(commit=False)
        now = clock.now()
        changed = []
        for obj in formset.deleted_objects:
            changed.append(f"deleted domain {obj.slug}")
            obj.delete()
        for obj in instances:
            if obj._state.adding:
                domain_add(domain=obj, now=now)
                changed.append(f"added domain {obj.slug}")
            else:
                changed.append(f"domain {obj.slug}")
                obj.save()
        formset.save_m2m()
        if change and changed:
            _record_edit(request, form.instance.id, f"fleet {form.instance.slug}", changed)

    def get_urls(self):
        urls = super().get_urls()
        export = path(
            "<path:object_id>/export/",
            self.admin_site.admin_view(self.export_view),
            name="fleets_fleet_export",
        )
        return [export, *urls]

    def export_view(self, request, object_id):
        """Download the fleet as a layout file that `seed_layout` accepts unchanged."""
        fleet = get_object_or_404(Fleet, pk=object_id)
        if not self.has_view_permission(request, fleet):
            return HttpResponse(status=403)
        body = json.dumps(layout_export(fleet), indent=2, ensure_ascii=False) + "\n"
        response = HttpResponse(body, content_type="application/json")
        response["Content-Disposition"] = f'attachment; filename="{fleet.slug}.layout.json"'
        return response

    @admin.action(description="Export the selected fleet as a layout file")
    def export_layout(self, request, queryset):
        if queryset.count() != 1:
            self.message_user(request, "select exactly one fleet to export", messages.WARNING)
            return None
        return self.export_view(request, str(queryset.get().pk))

    @admin.action(description="Reconcile the selected fleets now")
    def reconcile_now(self, request, queryset):
        if not request.POST.get("confirm"):
            return _confirm(
                self,
                request,
                queryset,
                action="reconcile_now",
                title="Reconcile now",
                text="Run a reconcile tick (heartbeats, failover detection, advance the "
                "in-flight operation) for these fleets:",
            )
        for fleet in queryset:
            result = dashboard_actions.reconcile_now(fleet=fleet, actor=_actor(request))
            _report(self, request, result, fleet.slug)
        return None

    @admin.action(description="Record golden baselines from the active domain")
    def record_baselines(self, request, queryset):
        if not request.POST.get("confirm"):
            return _confirm(
                self,
                request,
                queryset,
                action="record_baselines",
                title="Record golden baselines",
                text="Probe each fleet's active domain and record its answers as the golden "
                "baselines (after an expected change, such as an engine upgrade; each replaced "
                "baseline is an event):",
            )
        for fleet in queryset:
            result = dashboard_actions.record_baseline(
                fleet=fleet, target=None, actor=_actor(request)
            )
            _report(self, request, result, fleet.slug)
        return None

    @admin.action(description="Run a failover drill now")
    def run_drill(self, request, queryset):
        if not request.POST.get("confirm"):
            return _confirm(
                self,
                request,
                queryset,
                action="run_drill",
                title="Run a failover drill",
                text="Drill each fleet's standby now, in the fleet's drill mode. check: training "
                "stops, the models wake and must answer their golden probes, then sleep and "
                "training restarts; routing never moves. round_trip: the standby is promoted "
                "and the active promoted back; routing moves twice:",
            )
        for fleet in queryset:
            result = dashboard_actions.request_drill(
                fleet=fleet, target=None, actor=_actor(request), mode=fleet.drill_mode
            )
            _report(self, request, result, fleet.slug)
        return None


def _replan(model_admin, request, domains) -> None:
    """Slots, models or GPUs may have changed: check each domain still fits, like a layout."""
    for domain in domains:
        for problem in domain_plan_apply(domain=domain):
            model_admin.message_user(
                request, f"GPU plan of {domain.slug}: {problem}", level=messages.ERROR
            )


# ---------------------------------------------------------------------------------------------
# Domain
# ---------------------------------------------------------------------------------------------


@admin.register(Domain)
class DomainAdmin(admin.ModelAdmin):
    form = af.DomainForm
    inlines = [SlotInline, ModelBindingInline]
    list_display = ("slug", "fleet", "role", "state", "provider", "priority", "last_seen_at")
    list_filter = ("fleet", "state", "provider")
    search_fields = ("slug", "display_name", "fleet__slug", "supervisor_url")
    readonly_fields = (
        "id",
        "role",
        "state",
        "state_updated_at",
        "last_seen_at",
        "report",
        "gpu_plan",
    )
    actions = [
        "promote_domain",
        "demote_domain",
        "provision_domain",
        "stop_domain",
        "adopt_reported_gpus",
    ]

    def get_fieldsets(self, request, obj=None):
        layout = [
            "slug",
            "display_name",
            ("provider", "priority"),
            "placement",
            "driver",
            "supervisor_url",
            "serving_base_url",
            "gpu_layout",
        ]
        if obj is None:
            return [(None, {"fields": ["fleet", *layout]})]
        return [
            (None, {"fields": layout}),
            ("GPU plan (read-only: re-planned on every save)", {"fields": ["gpu_plan"]}),
            (
                "State (read-only: moves only through operations and heartbeats)",
                {"fields": [("role", "state"), ("state_updated_at", "last_seen_at"), "id"]},
            ),
            ("Last supervisor report", {"classes": ["collapse"], "fields": ["report"]}),
        ]

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["fields"] = ["fleet", *af.DomainForm.Meta.fields]
        return super().get_form(request, obj, change, **kwargs)

    @admin.display(description="role")
    def role(self, obj):
        return DomainRole.ACTIVE if obj.fleet.active_domain_id == obj.pk else DomainRole.STANDBY

    @admin.display(description="last supervisor report")
    def report(self, obj):
        return _pretty_json(obj.last_report or {})

    @admin.display(description="GPU plan")
    def gpu_plan(self, obj):
        plan, problems = domain_plan(domain=obj)
        if plan is None and not problems:
            return "hand-placed: describe the domain's gpus to have its slots planned"
        lines = [f"REFUSED {p}" for p in problems]
        for g in plan.groups if plan else ():
            for s in g.servers:
                lines.append(
                    f"{s.name}: GPUs {list(g.gpu_indices)}{f' MIG {g.mig}' if g.mig else ''}, "
                    f"{s.need_mib} MiB awake (--gpu-memory-utilization {s.gpu_memory_utilization}"
                    f"), {s.sleep_residue_mib} MiB asleep"
                )
        for t in plan.trainers if plan else ():
            lines.append(f"trainer on GPU {t.gpu_index}: budget {t.budget_mib} MiB")
        return format_html("<pre>{}</pre>", "\n".join(lines))

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
        else:
            domain_add(domain=obj)
        if form.changed_data:
            _record_edit(request, obj.fleet_id, f"domain {obj.slug}", form.changed_data)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        _replan(self, request, [form.instance])

    def save_formset(self, request, form, formset, change):
        instances = formset.save(commit=False)
        domain = form.instance
        changed = []
        for obj in formset.deleted_objects:
            changed.append(f"deleted {obj}")
            obj.delete()
        for obj in instances:
            if isinstance(obj, ModelBinding):
                obj.domain = domain
            if isinstance(obj, Slot) and obj._state.adding:
                slot_add(slot=obj)
            else:
                obj.save()
            changed.append(str(obj))
        formset.save_m2m()
        if changed:
            _record_edit(request, domain.fleet_id, f"domain {domain.slug}", changed)

    def _operation_action(self, request, queryset, kind: str):
        verb = "Promote" if kind == OperationKind.PROMOTE else "Demote"
        if kind == OperationKind.PROMOTE:
            # One fleet has one active: two of its domains selected is a mistake to refuse
            # whole (promoting both would just run two operations back to back).
            fleets = list(queryset.values_list("fleet__slug", flat=True))
            twice = sorted({f for f in fleets if fleets.count(f) > 1})
            if twice:
                self.message_user(
                    request,
                    f"Select one domain per fleet to promote; nothing done ({', '.join(twice)})",
                    messages.ERROR,
                )
                return None
        if not request.POST.get("confirm"):
            text = (
                "Promote these domains? Training stops, models wake and are probed, then routing "
                "moves to each (one operation per fleet at a time):"
                if kind == OperationKind.PROMOTE
                else "Demote these standbys? Their models sleep and training starts:"
            )
            return _confirm(
                self,
                request,
                queryset,
                action=f"{verb.lower()}_domain",
                title=f"{verb} domains",
                text=text,
            )
        for domain in queryset.select_related("fleet"):
            result = dashboard_actions.request_operation(
                fleet=domain.fleet, kind=kind, target=str(domain.id), actor=_actor(request)
            )
            _report(self, request, result, f"{domain.fleet.slug}/{domain.slug}")
        return None

    @admin.action(description="Describe GPUs from the last supervisor report, and re-plan")
    def adopt_reported_gpus(self, request, queryset):
        for domain in queryset:
            problems = domain_gpus_adopt(domain=domain)
            for problem in problems:
                self.message_user(request, f"GPU plan: {problem}", level=messages.ERROR)
            if not problems:
                self.message_user(request, f"{domain.slug}: GPUs described and planned")

    @admin.action(description="Promote the selected domain to active")
    def promote_domain(self, request, queryset):
        return self._operation_action(request, queryset, OperationKind.PROMOTE)

    @admin.action(description="Demote the selected standby domains")
    def demote_domain(self, request, queryset):
        return self._operation_action(request, queryset, OperationKind.DEMOTE)

    def _provision_action(self, request, queryset, action: str):
        if not request.POST.get("confirm"):
            text = (
                "Provision these domains? Any cluster left from before is torn down and a new "
                "one is launched by the sky CLI (billed by the cloud):"
                if action == "provision"
                else "Stop these standbys? Their clusters are stopped or torn down; they cannot "
                "take over until provisioned again:"
            )
            return _confirm(
                self,
                request,
                queryset,
                action=f"{action}_domain",
                title=f"{action.capitalize()} domains",
                text=text,
            )
        for domain in queryset.select_related("fleet"):
            result = dashboard_actions.provision_move(
                fleet=domain.fleet, action=action, target=str(domain.id), actor=_actor(request)
            )
            _report(self, request, result, f"{domain.fleet.slug}/{domain.slug}")
        return None

    @admin.action(description="Provision the selected Haru-provisioned domains (failed or stopped)")
    def provision_domain(self, request, queryset):
        return self._provision_action(request, queryset, "provision")

    @admin.action(description="Stop the selected Haru-provisioned standbys")
    def stop_domain(self, request, queryset):
        return self._provision_action(request, queryset, "stop")


# ---------------------------------------------------------------------------------------------
# Operations and events: read-only
# ---------------------------------------------------------------------------------------------


class _ReadOnlyAdmin(admin.ModelAdmin):
    """View-only: rows are written by the services alone."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(FleetArchive)
class FleetArchiveAdmin(_ReadOnlyAdmin):
    list_display = ("slug", "deleted_at", "deleted_by", "operation_count", "event_count")
    search_fields = ("slug", "fleet_id", "deleted_by")
    readonly_fields = ("fleet_id", "slug", "deleted_at", "deleted_by", "archive_json")
    exclude = ("layout", "operations", "events")

    @admin.display(description="operations")
    def operation_count(self, obj):
        return len(obj.operations)

    @admin.display(description="events")
    def event_count(self, obj):
        return len(obj.events)

    @admin.display(description="layout, operations and events")
    def archive_json(self, obj):
        return _pretty_json(
            {"layout": obj.layout, "operations": obj.operations, "events": obj.events}
        )


@admin.register(Operation)
class OperationAdmin(_ReadOnlyAdmin):
    list_display = (
        "short_id",
        "fleet",
        "kind",
        "state",
        "target",
        "current_step",
        "cleanup",
        "reason",
        "requested_by",
        "created_at",
        "finished_at",
    )
    list_filter = ("fleet", "kind", "state", "reason", ("created_at", admin.DateFieldListFilter))
    search_fields = (
        "id",
        "target_domain_slug",
        "fleet__slug",
        "requested_by",
        "current_step",
        "error",
    )
    date_hierarchy = "created_at"
    list_select_related = ("fleet", "target_domain")
    readonly_fields = ("error_json",)
    exclude = ("error",)
    actions = ["cancel_operations"]

    @admin.action(description="Cancel the selected in-flight operations")
    def cancel_operations(self, request, queryset):
        """Cancel through the same service as the API; rows stay read-only otherwise."""
        if not request.POST.get("confirm"):
            return _confirm(
                self,
                request,
                queryset,
                action="cancel_operations",
                title="Cancel operations",
                text="Cancel these operations? Each stops between steps and routing does not "
                "move; a cancelled promotion's target is put back in standby posture. A "
                "promotion that already moved routing ends succeeded instead, without its "
                "remaining best-effort steps on the old active:",
            )
        for op in queryset.select_related("fleet"):
            result = dashboard_actions.cancel_operation(
                fleet=op.fleet, operation_id=str(op.id), actor=_actor(request)
            )
            _report(self, request, result, f"{op.fleet.slug}/{str(op.id)[:8]}")
        return None

    @admin.display(description="id", ordering="id")
    def short_id(self, obj):
        return str(obj.id)[:8]

    @admin.display(description="target", ordering="target_domain_slug")
    def target(self, obj):
        return obj.target_slug

    @admin.display(description="error")
    def error_json(self, obj):
        return _pretty_json(obj.error) if obj.error else "-"


@admin.register(Event)
class EventAdmin(_ReadOnlyAdmin):
    list_display = (
        "id",
        "created_at",
        "fleet",
        "kind",
        "domain",
        "step",
        "duration_ms",
        "actor",
        "operation_short",
    )
    list_filter = ("fleet", "kind", "step", ("created_at", admin.DateFieldListFilter))
    search_fields = ("kind", "actor", "step", "operation__id", "domain__slug")
    date_hierarchy = "created_at"
    list_select_related = ("fleet", "domain")
    readonly_fields = ("data_json",)
    exclude = ("data",)

    @admin.display(description="operation")
    def operation_short(self, obj):
        return str(obj.operation_id)[:8] if obj.operation_id else "-"

    @admin.display(description="data")
    def data_json(self, obj):
        return _pretty_json(obj.data)


admin.site.site_header = "Haru administration"
admin.site.site_title = "Haru admin"
admin.site.index_title = "Fleet layouts, operations and events"
admin.site.site_url = "/"


@admin.register(GoldenBaseline)
class GoldenBaselineAdmin(_ReadOnlyAdmin):
    """Read-only: baselines change only through "Record golden baselines" (an event each)."""

    list_display = (
        "fleet",
        "model_name",
        "adapter",
        "engine_version",
        "reason",
        "recorded_by",
        "recorded_at",
    )
    list_filter = ("fleet", "reason")
    search_fields = ("model_name", "adapter", "engine_version")
    list_select_related = ("fleet",)
