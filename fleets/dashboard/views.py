"""Dashboard views: thin. Each parses, calls one selector or action, and renders.

Who sees what (fleets/core/access.py): a logged-in user who may view at least one fleet is
admitted; lists and the overview show only the fleets the user may view, a fleet page only
renders for a viewer (403 otherwise, existing or not, unless the user may view every fleet),
its action buttons only for an operator, and an action posted without the role it needs is
answered 403 and audited (`access.denied`).

Pages render in full on load; `.../live/` renders only the part that changes, which the page's
script re-fetches after every broadcast (and on reconnect, to resynchronise).
"""

from __future__ import annotations

from functools import wraps
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.http import JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from fleets.base import clock
from fleets.base.clock import iso
from fleets.base.errors import ErrorCode
from fleets.core.access import DASHBOARD_ACTION_ROLES, Role
from fleets.core.states import DrillMode, OperationKind
from fleets.dashboard import actions
from fleets.dashboard.forms import ACTIONS, ROLLOUT_ACTIONS, ActionForm
from fleets.dashboard.selectors import OVERVIEW_PAGE_SIZE, fleet_page, heartbeats, overview_page
from fleets.models import Fleet
from fleets.reads.access import principal_label, user_grant
from fleets.reads.fleet_list import MAX_SEARCH, FleetStatus, parse_status
from fleets.services.access import access_denied_record

# At most this many fleets in one heartbeat poll (an overview page holds fewer).
MAX_POLLED_FLEETS = 4 * OVERVIEW_PAGE_SIZE


def member_required(view):
    """Send anonymous users to the login page; refuse users who may view no fleet at all."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        user = request.user
        if not user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not user_grant(user).is_member:
            return render(request, "dashboard/forbidden.html", status=403)
        return view(request, *args, **kwargs)

    return wrapper


def _fleet(slug: str) -> Fleet | None:
    return Fleet.objects.filter(slug=slug).first()


def _not_found(request, slug: str):
    # The site-wide 404 handler answers JSON for the API; a person gets a page.
    return render(request, "dashboard/not_found.html", {"slug": slug}, status=404)


def _refused(request, slug: str, fleet: Fleet | None, *, action: str, needed: Role):
    """Audit a refusal and answer 403 (a page, or the JSON envelope for the page's script)."""
    grant = user_grant(request.user)
    access_denied_record(
        fleet_id=fleet.pk if fleet is not None else None,
        actor=f"dashboard:{principal_label(request.user)}",
        surface="dashboard",
        action=action,
        needed=needed,
        held=grant.role(fleet.pk) if fleet is not None else Role.NONE,
    )
    message = f"you need the {needed.label} role on fleet {slug!r} to {action}"
    if _wants_json(request):
        return JsonResponse(
            {"error": {"code": ErrorCode.FORBIDDEN, "message": message}}, status=403
        )
    return render(request, "dashboard/forbidden.html", {"message": message}, status=403)


def _fleet_for(request, slug: str, *, action: str, needed: Role):
    """Return (the fleet, None) when the user holds `needed` on it, else (None, the answer):
    404 for a missing fleet only to a user who may view every fleet, 403 otherwise."""
    fleet = _fleet(slug)
    grant = user_grant(request.user)
    if fleet is None and grant.sees_every_fleet:
        return None, _not_found(request, slug)
    if fleet is None or not grant.allows(fleet.pk, needed):
        return None, _refused(request, slug, fleet, action=action, needed=needed)
    return fleet, None


def _overview_context(request) -> dict:
    """One page of the overview: `?q=` searches slug and name, `?status=` filters
    (unhealthy, not_ready, in_operation), `?page=` pages; only the fleets the user may view."""
    now = clock.now()
    text = request.GET.get("q", "").strip()[:MAX_SEARCH]
    try:
        status = parse_status(request.GET.get("status"))
        problem = ""
    except ValueError as exc:
        # Nothing hidden on a typo: the whole list, and the reason the filter was not applied.
        status, problem = None, str(exc)
    visible = user_grant(request.user).visible_ids()
    found = overview_page(
        now=now, visible=visible, text=text, status=status, page=request.GET.get("page", 1)
    )
    page = found["page"]
    return {
        "rows": found["rows"],
        "page": page,
        "q": text,
        "status": status.value if status else "",
        "statuses": [(s.value, s.value.replace("_", " ")) for s in FleetStatus],
        "filter_problem": problem,
        # The links keep the search and the filter; the live fragment re-fetches this same page.
        "query": urlencode({k: v for k, v in (("q", text), ("status", status or "")) if v}),
        "page_query": urlencode(
            {k: v for k, v in (("q", text), ("status", status or ""), ("page", page.number)) if v}
        ),
        # The heartbeat poll covers the fleets on this page only, not every fleet.
        "page_slugs": ",".join(row["slug"] for row in found["rows"]),
        "generated_at": iso(now),
    }


def _wants_json(request) -> bool:
    return "application/json" in request.headers.get("Accept", "")


@require_GET
@never_cache
@member_required
def overview(request):
    return render(request, "dashboard/overview.html", _overview_context(request))


@require_GET
@never_cache
@member_required
def overview_live(request):
    return render(request, "dashboard/_overview_live.html", _overview_context(request))


@require_GET
@never_cache
@member_required
def heartbeats_live(request):
    """Last heartbeat per domain (`?fleet=<slug>` for one fleet), polled every second."""
    slug = request.GET.get("fleet")
    if slug is None:
        visible = user_grant(request.user).visible_ids()
        # The overview asks for the fleets on its page (`?fleets=a,b`): its poll, once a
        # second, must not read every fleet of a large deployment.
        named = [n for n in request.GET.get("fleets", "").split(",") if n][:MAX_POLLED_FLEETS]
        if named or "fleets" in request.GET:
            ids = Fleet.objects.filter(slug__in=named).values_list("pk", flat=True)
            wanted = frozenset(str(pk) for pk in ids)
            visible = wanted if visible is None else wanted & visible
        return JsonResponse(heartbeats(now=clock.now(), fleet_ids=visible))
    fleet, refused = _fleet_for(request, slug, action="view", needed=Role.VIEW)
    if fleet is None:
        # The poll reads JSON whatever it asked for: the refusal's page would not parse.
        missing = refused.status_code == 404
        code = ErrorCode.NOT_FOUND if missing else ErrorCode.FORBIDDEN
        message = "no such fleet" if missing else "you may not view this fleet"
        return JsonResponse(
            {"error": {"code": code, "message": message}}, status=refused.status_code
        )
    return JsonResponse(heartbeats(now=clock.now(), fleet=fleet))


@require_GET
@never_cache
@member_required
def fleet_detail(request, slug: str):
    return _fleet_page(request, slug, "dashboard/fleet.html")


@require_GET
@never_cache
@member_required
def fleet_live(request, slug: str):
    return _fleet_page(request, slug, "dashboard/_fleet_live.html")


def _fleet_page(request, slug: str, template: str):
    fleet, refused = _fleet_for(request, slug, action="view", needed=Role.VIEW)
    if fleet is None:
        return refused
    context = fleet_page(fleet, now=clock.now())
    # The buttons render only for who may press them; the action view checks again.
    context["can_operate"] = user_grant(request.user).allows(fleet.pk, Role.OPERATE)
    return render(request, template, context)


@require_POST
@member_required
def fleet_action(request, slug: str, action: str):
    """Promote, demote, reconcile, cancel, provision, stop, drill, baseline, or pause, resume or
    abort a rollout; unconfirmed requests get a confirmation page first."""
    if action not in ACTIONS:
        return _not_found(request, slug)
    fleet, refused = _fleet_for(request, slug, action=action, needed=DASHBOARD_ACTION_ROLES[action])
    if fleet is None:
        return refused
    form = ActionForm(request.POST, action=action)
    if not form.is_valid():
        message = "; ".join(str(e) for errs in form.errors.values() for e in errs)
        if _wants_json(request):
            return JsonResponse(
                {"error": {"code": ErrorCode.INVALID_REQUEST, "message": message}}, status=400
            )
        messages.error(request, message)
        return redirect("dashboard:fleet", slug=fleet.slug)
    target = form.cleaned_data["target"]
    mode = form.cleaned_data["mode"] or DrillMode.CHECK
    if not form.cleaned_data["confirm"]:
        # No script (or a crafted POST): confirm on a page of its own before acting.
        return render(
            request,
            "dashboard/confirm.html",
            {"fleet": fleet, "action": action, "target": target, "mode": mode},
        )
    actor = f"dashboard:{request.user.get_username()}"
    if action == "reconcile":
        result = actions.reconcile_now(fleet=fleet, actor=actor)
    elif action == "cancel":
        result = actions.cancel_operation(fleet=fleet, operation_id=target, actor=actor)
    elif action in ("provision", "stop"):
        result = actions.provision_move(fleet=fleet, action=action, target=target, actor=actor)
    elif action == "drill":
        result = actions.request_drill(fleet=fleet, target=target or None, actor=actor, mode=mode)
    elif action in ROLLOUT_ACTIONS:
        result = actions.rollout_move(fleet=fleet, action=action, rollout_id=target, actor=actor)
    elif action == "baseline":
        result = actions.record_baseline(fleet=fleet, target=target or None, actor=actor)
    else:
        kind = OperationKind.PROMOTE if action == "promote" else OperationKind.DEMOTE
        result = actions.request_operation(fleet=fleet, kind=kind, target=target, actor=actor)
    if _wants_json(request):
        if result.ok:
            body = {"status": result.code, "message": result.message}
            if result.operation_id:
                body["operationId"] = result.operation_id
            return JsonResponse(body, status=result.status)
        return JsonResponse(
            {"error": {"code": result.code, "message": result.message}}, status=result.status
        )
    (messages.success if result.ok else messages.error)(request, result.message)
    return redirect(reverse("dashboard:fleet", kwargs={"slug": fleet.slug}))
