"""Dashboard views: staff only, thin. Each parses, calls one selector or action, and renders.

Pages render in full on load; `.../live/` renders only the part that changes, which the page's
script re-fetches after every broadcast (and on reconnect, to resynchronise).
"""

from __future__ import annotations

from functools import wraps

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
from fleets.core.states import DrillMode, OperationKind
from fleets.dashboard import actions
from fleets.dashboard.forms import ACTIONS, ActionForm
from fleets.dashboard.selectors import fleet_page, heartbeats, overview_rows
from fleets.models import Fleet


def staff_required(view):
    """Send anonymous users to the login page; refuse logged-in users who are not staff."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        user = request.user
        if not user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not (user.is_active and user.is_staff):
            return render(request, "dashboard/forbidden.html", status=403)
        return view(request, *args, **kwargs)

    return wrapper


def _fleet(slug: str) -> Fleet | None:
    return Fleet.objects.filter(slug=slug).first()


def _not_found(request, slug: str):
    # The site-wide 404 handler answers JSON for the API; a person gets a page.
    return render(request, "dashboard/not_found.html", {"slug": slug}, status=404)


def _overview_context() -> dict:
    now = clock.now()
    return {"rows": overview_rows(now=now), "generated_at": iso(now)}


def _wants_json(request) -> bool:
    return "application/json" in request.headers.get("Accept", "")


@require_GET
@never_cache
@staff_required
def overview(request):
    return render(request, "dashboard/overview.html", _overview_context())


@require_GET
@never_cache
@staff_required
def overview_live(request):
    return render(request, "dashboard/_overview_live.html", _overview_context())


@require_GET
@never_cache
@staff_required
def heartbeats_live(request):
    """Last heartbeat per domain (`?fleet=<slug>` for one fleet), polled every second."""
    slug = request.GET.get("fleet")
    fleet = None
    if slug is not None:
        fleet = _fleet(slug)
        if fleet is None:
            return JsonResponse(
                {"error": {"code": ErrorCode.NOT_FOUND, "message": "no such fleet"}}, status=404
            )
    return JsonResponse(heartbeats(now=clock.now(), fleet=fleet))


@require_GET
@never_cache
@staff_required
def fleet_detail(request, slug: str):
    fleet = _fleet(slug)
    if fleet is None:
        return _not_found(request, slug)
    return render(request, "dashboard/fleet.html", fleet_page(fleet, now=clock.now()))


@require_GET
@never_cache
@staff_required
def fleet_live(request, slug: str):
    fleet = _fleet(slug)
    if fleet is None:
        return _not_found(request, slug)
    return render(request, "dashboard/_fleet_live.html", fleet_page(fleet, now=clock.now()))


@require_POST
@staff_required
def fleet_action(request, slug: str, action: str):
    """Promote, demote, reconcile, cancel, provision or stop; unconfirmed requests get a
    confirmation page first."""
    fleet = _fleet(slug)
    if fleet is None or action not in ACTIONS:
        return _not_found(request, slug)
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
