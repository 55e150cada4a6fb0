"""The Django admin: layouts (fleets, domains, slots, bindings), the read-only history,
rollouts and adapter versions.
Importing the package registers the model admins (Django's admin autodiscovery imports it)."""

from django.contrib import admin

from fleets.admin import (  # noqa: F401 - registers the ModelAdmins
    adapters,
    history,
    layouts,
    rollouts,
    tokens,
)

admin.site.site_header = "Haru administration"
admin.site.site_title = "Haru admin"
admin.site.index_title = "Fleet layouts, operations and events"
admin.site.site_url = "/"
