"""The admin's adapter versions: read-only list and detail with each domain's copy inline.

Every field is the registry's (fleets/services/adapters.py registers a version and moves its
copies by compare-and-swap); what an operator does to adapters (pin, unpin, a rollout) goes
through the API and the dashboard, never a form here.
"""

from __future__ import annotations

from django.contrib import admin

from fleets.admin.actions import pretty_json
from fleets.admin.history import _ReadOnlyAdmin
from fleets.models import AdapterCopy, AdapterVersion


class AdapterCopyInline(admin.TabularInline):
    model = AdapterCopy
    extra = 0
    can_delete = False
    show_change_link = False
    fields = ("domain", "state", "bytes_stored", "loaded_at", "probed_at", "why", "updated_at")
    readonly_fields = fields
    ordering = ("domain__slug",)

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(AdapterVersion)
class AdapterVersionAdmin(_ReadOnlyAdmin):
    list_display = (
        "name",
        "version",
        "fleet",
        "state",
        "base_model",
        "size_bytes",
        "completed_at",
        "first_served_at",
    )
    list_filter = ("fleet", "name", "state")
    search_fields = ("name", "digest", "fleet__slug", "checkpoint")
    list_select_related = ("fleet",)
    # The manifest (files, eval answers) is shown as JSON, not as an editable field.
    exclude = ("manifest",)
    readonly_fields = ("manifest_json",)
    inlines = (AdapterCopyInline,)

    @admin.display(description="manifest (as the trainer wrote it)")
    def manifest_json(self, obj):
        return pretty_json(obj.manifest)
