"""The Django admin: layouts (fleets, domains, slots, bindings) and the read-only history.
Importing the package registers the model admins (Django's admin autodiscovery imports it)."""

from fleets.admin import site  # noqa: F401 - registers the ModelAdmins
