"""The admin of fleet layouts: fleets with their domains, domains with their slots and models.

Layout fields (slugs, URLs, placement, policy, slots, models) are editable with the layout
loader's validation. The routing pointer, the revision and every state field are read-only: they
move only through operations. The actions (promote, demote, provision, reconcile, drills) call
the same services as the API, after a confirmation page.
"""

from __future__ import annotations

import json

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Subquery
from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.html import format_html
from guardian.admin import GuardedModelAdminMixin

from fleets.admin import forms as af
from fleets.admin.actions import (
    actor,
    administers,
    administers_all,
    confirm_then,
    confirmed_action,
    domain_label,
    pretty_json,
    record_edit,
    refuse_administration,
    replan,
)
from fleets.base import clock
from fleets.base.errors import ServiceError
from fleets.core.policy import Policy
from fleets.core.states import IN_FLIGHT_OPERATION_STATES, DomainRole, OperationKind
from fleets.dashboard import actions as dashboard_actions
from fleets.models import Domain, Event, Fleet, ModelBinding, Operation, Slot
from fleets.reads.fleet_list import FleetStatus, parse_status, with_status
from fleets.reads.selectors import operation_in_flight
from fleets.services.fleets import fleet_delete
from fleets.services.gpu_plan import domain_gpus_adopt, domain_plan
from fleets.services.inventory import domain_add, slot_add
from fleets.services.layouts import layout_export

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


class FleetStatusFilter(admin.SimpleListFilter):
    """The overview's status filter (fleets/reads/fleet_list.py) in the fleet list."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return [(s.value, s.value.replace("_", " ")) for s in FleetStatus]

    def queryset(self, request, queryset):
        try:
            status = parse_status(self.value())
        except ValueError:
            return queryset.none()
        if status is None:
            return queryset
        chosen = with_status(queryset, status, clock.now())
        return queryset.filter(pk__in=[f.pk for f in chosen])


@admin.register(Fleet)
class FleetAdmin(GuardedModelAdminMixin, admin.ModelAdmin):
    # django-guardian's "Object permissions" page (<id>/permissions/) grants a user or a group
    # a role on this one fleet (docs/access.md); Haru's own change form (not the mixin's)
    # links to it. (The stubs of Django and guardian disagree on the attribute's kind.)
    change_form_template = "admin/fleets/fleet/change_form.html"  # type: ignore[misc]
    form = af.FleetForm
    inlines = [DomainInline]
    list_display = ("slug", "display_name", "active", "route_revision", "in_flight", "dashboard")
    search_fields = ("slug", "display_name")
    list_filter = (FleetStatusFilter,)
    # A page of fleets reads the active domain by join and the operations in flight once per
    # page (`get_queryset`, `in_flight`), not one query per row.
    list_select_related = ("active_domain",)
    list_per_page = 50
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
        busy += [
            f"{f.slug}: you need the administer role on it"
            for f in fleets
            if not administers(request, f.pk)
        ]
        return summary, {"fleets": len(fleets)}, set(), busy

    # Per-fleet administration on top of the admin's model permissions (fleets/admin/actions.py,
    # `administers`): a page a staff user may use, on the fleets that user administers.
    def has_add_permission(self, request):
        # A new fleet is no one's yet: creating one is for who administers every fleet.
        return super().has_add_permission(request) and administers_all(request)

    def has_change_permission(self, request, obj=None):
        fleet_id = obj.pk if obj is not None else None
        return super().has_change_permission(request, obj) and administers(request, fleet_id)

    def has_delete_permission(self, request, obj=None):
        fleet_id = obj.pk if obj is not None else None
        return super().has_delete_permission(request, obj) and administers(request, fleet_id)

    def _access_page(self, view, request, object_pk, *args):
        """Guardian's Access pages, on a fleet the user administers only (audited otherwise)."""
        fleet = get_object_or_404(Fleet, pk=object_pk)
        if not administers(request, fleet.pk):
            refuse_administration(request, fleet.pk, "manage access")
            raise PermissionDenied
        return view(request, object_pk, *args)

    def obj_perms_manage_view(self, request, object_pk):
        return self._access_page(super().obj_perms_manage_view, request, object_pk)

    def obj_perms_manage_user_view(self, request, object_pk, user_id):
        return self._access_page(super().obj_perms_manage_user_view, request, object_pk, user_id)

    def obj_perms_manage_group_view(self, request, object_pk, group_id):
        return self._access_page(super().obj_perms_manage_group_view, request, object_pk, group_id)

    def delete_model(self, request, obj):
        if not administers(request, obj.pk):
            refuse_administration(request, obj.pk, "delete")
            self.message_user(request, f"{obj.slug}: you need the administer role", messages.ERROR)
            return
        try:
            fleet_delete(fleet_id=obj.id, actor=actor(request))
        except ServiceError as exc:
            self.message_user(request, exc.message, messages.ERROR)

    def delete_queryset(self, request, queryset):
        for fleet in queryset:
            self.delete_model(request, fleet)

    @admin.display(description="active domain")
    def active(self, obj):
        return obj.active_domain.slug if obj.active_domain_id else "-"

    def get_queryset(self, request):
        # The in-flight operation of each listed fleet, one subquery for the page.
        busy = Operation.objects.filter(
            fleet_id=OuterRef("pk"), state__in=IN_FLIGHT_OPERATION_STATES
        )
        return (
            super()
            .get_queryset(request)
            .annotate(
                in_flight_kind=Subquery(busy.values("kind")[:1]),
                in_flight_target=Subquery(busy.values("target_domain_slug")[:1]),
                in_flight_step=Subquery(busy.values("current_step")[:1]),
                in_flight_state=Subquery(busy.values("state")[:1]),
            )
        )

    @admin.display(description="in flight")
    def in_flight(self, obj):
        kind = getattr(obj, "in_flight_kind", None)
        if kind is None:
            return "-"
        return f"{kind} -> {obj.in_flight_target} ({obj.in_flight_step or obj.in_flight_state})"

    @admin.display(description="dashboard")
    def dashboard(self, obj):
        return format_html('<a href="{}">open</a>', reverse("dashboard:fleet", args=[obj.slug]))

    @admin.display(description="policy with defaults")
    def resolved_policy(self, obj):
        return pretty_json(Policy.resolve(obj.policy).to_json())

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if change and form.changed_data:
            record_edit(request, obj.id, f"fleet {obj.slug}", form.changed_data)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        replan(self, request, Domain.objects.filter(fleet=form.instance))

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
            record_edit(request, form.instance.id, f"fleet {form.instance.slug}", changed)

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

    reconcile_now = confirmed_action(
        "reconcile_now",
        description="Reconcile the selected fleets now",
        title="Reconcile now",
        text="Run a reconcile tick (heartbeats, failover detection, advance the "
        "in-flight operation) for these fleets:",
        run=lambda fleet, who: dashboard_actions.reconcile_now(fleet=fleet, actor=who),
    )
    record_baselines = confirmed_action(
        "record_baselines",
        description="Record golden baselines from the active domain",
        title="Record golden baselines",
        text="Probe each fleet's active domain and record its answers as the golden "
        "baselines (after an expected change, such as an engine upgrade; each replaced "
        "baseline is an event):",
        run=lambda fleet, who: dashboard_actions.record_baseline(
            fleet=fleet, target=None, actor=who
        ),
    )
    run_drill = confirmed_action(
        "run_drill",
        description="Run a failover drill now",
        title="Run a failover drill",
        text="Drill each fleet's standby now, in the fleet's drill mode. check: training "
        "stops, the models wake and must answer their golden probes, then sleep and "
        "training restarts; routing never moves. round_trip: the standby is promoted "
        "and the active promoted back; routing moves twice:",
        run=lambda fleet, who: dashboard_actions.request_drill(
            fleet=fleet, target=None, actor=who, mode=fleet.drill_mode
        ),
    )


# ---------------------------------------------------------------------------------------------
# Domain
# ---------------------------------------------------------------------------------------------


def _provision_action(action: str, description: str, text: str):
    """The admin action that asks for the provisioning move `action` on each selected domain."""
    return confirmed_action(
        f"{action}_domain",
        description=description,
        title=f"{action.capitalize()} domains",
        text=text,
        run=lambda domain, who: dashboard_actions.provision_move(
            fleet=domain.fleet, action=action, target=str(domain.id), actor=who
        ),
        label=domain_label,
        related=("fleet",),
    )


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

    # A domain is part of its fleet's layout: editing one needs the administer role on that
    # fleet, adding one the role on every fleet (fleets/admin/actions.py, `administers`).
    def has_add_permission(self, request):
        return super().has_add_permission(request) and administers_all(request)

    def has_change_permission(self, request, obj=None):
        fleet_id = obj.fleet_id if obj is not None else None
        return super().has_change_permission(request, obj) and administers(request, fleet_id)

    def has_delete_permission(self, request, obj=None):
        fleet_id = obj.fleet_id if obj is not None else None
        return super().has_delete_permission(request, obj) and administers(request, fleet_id)

    def get_fieldsets(self, request, obj=None):
        layout = [
            "slug",
            "display_name",
            ("provider", "priority"),
            "placement",
            "driver",
            "supervisor_url",
            ("supervisor_transport", "supervisor_fingerprint"),
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
        return pretty_json(obj.last_report or {})

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
            record_edit(request, obj.fleet_id, f"domain {obj.slug}", form.changed_data)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        replan(self, request, [form.instance])

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
            record_edit(request, domain.fleet_id, f"domain {domain.slug}", changed)

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
        return confirm_then(
            self,
            request,
            queryset.select_related("fleet"),
            action=f"{verb.lower()}_domain",
            title=f"{verb} domains",
            text=(
                "Promote these domains? Training stops, models wake and are probed, then routing "
                "moves to each (one operation per fleet at a time):"
                if kind == OperationKind.PROMOTE
                else "Demote these standbys? Their models sleep and training starts:"
            ),
            each=lambda domain: (
                dashboard_actions.request_operation(
                    fleet=domain.fleet, kind=kind, target=str(domain.id), actor=actor(request)
                ),
                domain_label(domain),
            ),
        )

    # A layout edit, not an operation: it needs the right to change domains.
    @admin.action(
        description="Describe GPUs from the last supervisor report, and re-plan",
        permissions=["change"],
    )
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

    provision_domain = _provision_action(
        "provision",
        "Provision the selected Haru-provisioned domains (failed or stopped)",
        "Provision these domains? Any cluster left from before is torn down and a new one is "
        "launched by the sky CLI (billed by the cloud):",
    )
    stop_domain = _provision_action(
        "stop",
        "Stop the selected Haru-provisioned standbys",
        "Stop these standbys? Their clusters are stopped or torn down; they cannot take over "
        "until provisioned again:",
    )
