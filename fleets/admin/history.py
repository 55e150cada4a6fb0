"""The admin's read-only history: operations, events, golden baselines and deleted fleets'
archives. Rows here are written by the services alone; the one action, cancelling an
operation, calls the same service as the API after a confirmation page.
"""

from __future__ import annotations

from django.contrib import admin

from fleets.admin.actions import actor, confirm_then, pretty_json
from fleets.dashboard import actions as dashboard_actions
from fleets.models import Event, FleetArchive, GoldenBaseline, Operation


class _ReadOnlyAdmin(admin.ModelAdmin):
    """View-only: rows are written by the services alone."""

    def get_readonly_fields(self, request, obj=None):
        # Every field, not only by permission: each is the services' (an operation's state,
        # step, routing flag, error and times move by compare-and-swap), so no form this admin
        # builds has an input for one, whoever asks.
        excluded = set(self.exclude or ())
        fields = [f.name for f in self.model._meta.fields if f.editable and f.name not in excluded]
        return list(dict.fromkeys([*fields, *self.readonly_fields]))

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
        return pretty_json(
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
        return confirm_then(
            self,
            request,
            queryset.select_related("fleet"),
            action="cancel_operations",
            title="Cancel operations",
            text="Cancel these operations? Each stops between steps and routing does not "
            "move; a cancelled promotion's target is put back in standby posture. A "
            "promotion that already moved routing ends succeeded instead, without its "
            "remaining best-effort steps on the old active:",
            each=lambda op: (
                dashboard_actions.cancel_operation(
                    fleet=op.fleet, operation_id=str(op.id), actor=actor(request)
                ),
                f"{op.fleet.slug}/{str(op.id)[:8]}",
            ),
        )

    @admin.display(description="id", ordering="id")
    def short_id(self, obj):
        return str(obj.id)[:8]

    @admin.display(description="target", ordering="target_domain_slug")
    def target(self, obj):
        return obj.target_slug

    @admin.display(description="error")
    def error_json(self, obj):
        return pretty_json(obj.error) if obj.error else "-"


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
        return pretty_json(obj.data)


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
