"""What the admin's pages share: rendering JSON, naming the actor, auditing an edit, and the
confirm-then-act flow of every state-moving action (the same services as the API), which runs
only on the rows whose fleet the user may operate (fleets/core/access.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html

from fleets.core.access import Role
from fleets.dashboard import actions as dashboard_actions
from fleets.models import Fleet
from fleets.reads.access import principal_label, user_grant
from fleets.services.access import access_denied_record
from fleets.services.events import event_record
from fleets.services.gpu_plan import domain_plan_apply


def pretty_json(value) -> str:
    return format_html(
        '<pre style="white-space: pre-wrap; margin: 0">{}</pre>',
        json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False),
    )


def actor(request) -> str:
    return f"admin:{request.user.get_username()}"


def record_edit(request, fleet_id, what: str, changed: list[str]) -> None:
    """Audit a layout edit; the event also tells open dashboards to refresh."""
    event_record(
        fleet_id=fleet_id,
        kind="layout.edited",
        actor=actor(request),
        data={"what": what, "changed": sorted(set(changed))[:50]},
    )


def confirm_then(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet,
    *,
    action: str,
    title: str,
    text: str,
    each: Callable[[Any], tuple[dashboard_actions.ActionResult, str]],
) -> TemplateResponse | None:
    """Show the confirmation page of a state-moving action; once confirmed, run `each` on every
    selected row and report its result under the label it returns."""
    if not request.POST.get("confirm"):
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
    grant = user_grant(request.user)
    for obj in queryset:
        fleet_id = obj.pk if isinstance(obj, Fleet) else obj.fleet_id
        if not grant.allows(fleet_id, Role.OPERATE):
            _refuse(modeladmin, request, obj, fleet_id, action, grant.role(fleet_id))
            continue
        result, label = each(obj)
        level = messages.SUCCESS if result.ok else messages.ERROR
        modeladmin.message_user(request, f"{label}: {result.message}", level)
    return None


def administers(request, fleet_id: object | None) -> bool:
    """Whether the user administers the fleet `fleet_id` (None: any fleet at all).

    The admin's model permissions (change_fleet, delete_domain, ...) still say which pages a
    staff user may use; this says on which fleets: editing a layout, deleting a fleet and
    managing its access need the administer role on that fleet as well."""
    grant = user_grant(request.user)
    if fleet_id is None:
        return max([grant.all_fleets, *grant.per_fleet.values()]) >= Role.ADMINISTER
    return grant.allows(fleet_id, Role.ADMINISTER)


def administers_all(request) -> bool:
    """Whether the user administers every fleet (present and future)."""
    return user_grant(request.user).all_fleets >= Role.ADMINISTER


def refuse_administration(request, fleet_id, action: str) -> None:
    """Audit an admin request refused for want of the administer role on `fleet_id`."""
    access_denied_record(
        fleet_id=fleet_id,
        actor=f"admin:{principal_label(request.user)}",
        surface="admin",
        action=action,
        needed=Role.ADMINISTER,
        held=user_grant(request.user).role(fleet_id),
    )


def _refuse(modeladmin, request, obj, fleet_id, action: str, held: Role) -> None:
    """Skip a row whose fleet the user may not operate: say so, and audit it."""
    access_denied_record(
        fleet_id=fleet_id,
        actor=f"admin:{principal_label(request.user)}",
        surface="admin",
        action=action,
        needed=Role.OPERATE,
        held=held,
    )
    modeladmin.message_user(
        request, f"{obj}: refused, you need the operate role on its fleet", messages.ERROR
    )


def confirmed_action(
    name: str,
    *,
    description: str,
    title: str,
    text: str,
    run: Callable[[Any, str], dashboard_actions.ActionResult],
    label: Callable[[Any], str] = lambda row: row.slug,
    related: tuple[str, ...] = (),
) -> Callable[[admin.ModelAdmin, HttpRequest, QuerySet], TemplateResponse | None]:
    """Declare the admin action `name`: its confirmation page (`title`, `text`), then
    `run(row, actor)` on every selected row (with `related` joined), reported under `label`."""

    @admin.action(description=description)
    def action(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet):
        return confirm_then(
            modeladmin,
            request,
            queryset.select_related(*related) if related else queryset,
            action=name,
            title=title,
            text=text,
            each=lambda row: (run(row, actor(request)), label(row)),
        )

    action.__name__ = name
    return action


def domain_label(domain: Any) -> str:
    """How a domain is named in an action's report: `fleet/domain`."""
    return f"{domain.fleet.slug}/{domain.slug}"


def replan(modeladmin: admin.ModelAdmin, request: HttpRequest, domains: Iterable[Any]) -> None:
    """Slots, models or GPUs may have changed: check each domain still fits, like a layout."""
    for domain in domains:
        for problem in domain_plan_apply(domain=domain):
            modeladmin.message_user(
                request, f"GPU plan of {domain.slug}: {problem}", level=messages.ERROR
            )
