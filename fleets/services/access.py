"""Write access: grant and take back fleet roles, create and revoke API tokens, and audit every
denial as an `access.denied` event of the fleet it concerned.

Denials are bounded before they reach the event table: one event per principal, fleet, action
and surface per `DENIAL_AUDIT_WINDOW_S`, the later ones counted (the next event's
`data.suppressed`) and every one counted in `haru_access_denied_total`. The count lives in
Django's cache (per process with the default local-memory cache, shared with a shared cache),
so a client hammering a forbidden endpoint costs one event a minute, not one a request.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.core.cache import cache
from django.db import DatabaseError, transaction
from django.db.models import Q
from guardian.models import GroupObjectPermission, UserObjectPermission
from guardian.shortcuts import assign_perm, remove_perm
from prometheus_client import Counter

from fleets.core.access import (
    DENIAL_AUDIT_WINDOW_S,
    ROLE_PERMISSIONS,
    STORED_TOKEN_PREFIX,
    TOKEN_TOUCH_EVERY_S,
    Role,
    TokenScope,
)
from fleets.models import ApiToken, Fleet, Id
from fleets.reads.access import secret_digest
from fleets.services.events import event_record

log = logging.getLogger(__name__)

ACCESS_DENIED = "access.denied"
# fleets/core/access.py says why a token's use is written at most this often.
_TOUCH_EVERY = timedelta(seconds=TOKEN_TOUCH_EVERY_S)

DENIED = Counter(
    "haru_access_denied_total",
    "Requests refused for want of a fleet role or token scope, by surface (api, dashboard, "
    "live, admin); every one, including those folded into one access.denied event.",
    ["surface"],
)
# Every surface's series exists from the start (at 0), so a rate over it is defined before the
# first refusal, in each process's multiprocess file too.
SURFACES = ("api", "dashboard", "live", "admin")
for _surface in SURFACES:
    DENIED.labels(surface=_surface)


# ---------------------------------------------------------------------------------------------
# Roles
# ---------------------------------------------------------------------------------------------


def fleet_role_set(*, holder: Any, role: Role, fleet: Fleet | None = None) -> None:
    """Give `holder` (a user or a Group) exactly `role` on `fleet` (None: on every fleet, as a
    model permission); Role.NONE takes every role there away."""
    fleet_perms = [f"fleets.{codename}" for codename in ROLE_PERMISSIONS.values()]
    with transaction.atomic():
        for perm in fleet_perms:
            if fleet is None:
                _model_perm(holder, perm, add=False)
            else:
                remove_perm(perm, holder, fleet)
        if role is not Role.NONE:
            perm = f"fleets.{ROLE_PERMISSIONS[role]}"
            if fleet is None:
                _model_perm(holder, perm, add=True)
            else:
                assign_perm(perm, holder, fleet)


def fleet_access_forget(*, fleet_id: Id) -> int:
    """Delete every per-fleet grant on `fleet_id` (its fleet is being deleted); return how many.

    Guardian's rows name their object generically (content type and primary key as text), so
    no foreign key removes them with the fleet; left behind, they would keep counting a user
    as a member of the portal for a fleet that is gone."""
    fleet_type = ContentType.objects.get_for_model(Fleet)
    gone = 0
    for model in (UserObjectPermission, GroupObjectPermission):
        gone += model.objects.filter(content_type=fleet_type, object_pk=str(fleet_id)).delete()[0]
    return gone


def _model_perm(holder: Any, perm: str, *, add: bool) -> None:
    # assign_perm with no object adds a model permission; removing one is Django's own call.
    if add:
        assign_perm(perm, holder)
        return
    app_label, codename = perm.split(".", 1)
    permission = Permission.objects.get(content_type__app_label=app_label, codename=codename)
    target = holder.permissions if isinstance(holder, Group) else holder.user_permissions
    target.remove(permission)


# ---------------------------------------------------------------------------------------------
# API tokens
# ---------------------------------------------------------------------------------------------


def new_token_secret() -> str:
    """A new stored token's secret: the prefix that marks it, then 32 random bytes."""
    return STORED_TOKEN_PREFIX + secrets.token_urlsafe(32)


def api_token_create(
    *,
    name: str,
    scope: TokenScope,
    fleets: Iterable[Fleet] | None,
    created_by: Any = None,
) -> tuple[ApiToken, str]:
    """Create a token for `fleets` (None: every fleet); return it with its secret, which is
    shown this once and kept only as its SHA-256."""
    secret = new_token_secret()
    with transaction.atomic():
        token = ApiToken.objects.create(
            name=name,
            prefix=secret[: len(STORED_TOKEN_PREFIX) + 7],
            secret_sha256=secret_digest(secret),
            scope=scope.value,
            all_fleets=fleets is None,
            created_by=created_by,
        )
        if fleets is not None:
            token.fleets.set(list(fleets))
    return token, secret


def api_token_revoke(*, name: str, now: datetime) -> bool:
    """Revoke the token `name` from now on; False when there is no live token of that name."""
    return bool(ApiToken.objects.filter(name=name, revoked_at__isnull=True).update(revoked_at=now))


def api_token_touch(*, token_id: int, now: datetime) -> bool:
    """Record that the token was used, at most once per `_TOUCH_EVERY` (a guarded update)."""
    stale = Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - _TOUCH_EVERY)
    return bool(ApiToken.objects.filter(Q(pk=token_id) & stale).update(last_used_at=now))


# ---------------------------------------------------------------------------------------------
# Denials
# ---------------------------------------------------------------------------------------------


def access_denied_record(
    *,
    fleet_id: Id | None,
    actor: str,
    surface: str,
    action: str,
    needed: Role,
    held: Role,
) -> bool:
    """Audit one denial; return whether it became an event (False: folded into the window's
    first, or no fleet to file it under, or the database refused the write)."""
    DENIED.labels(surface=surface).inc()
    detail = {"surface": surface, "action": action, "needed": needed.label, "held": held.label}
    key = hashlib.sha256(f"{actor}\n{fleet_id}\n{surface}\n{action}".encode()).hexdigest()[:40]
    suppressed = _first_in_window(key)
    if suppressed is None:
        return False  # folded into the window's first, which is already recorded
    if fleet_id is None:
        # A fleet that does not exist (or no fleet at all) has no event stream to write to.
        log.warning("access denied to %s: %s (suppressed %d)", actor, detail, suppressed)
        return False
    try:
        with transaction.atomic():
            event_record(
                fleet_id=fleet_id,
                kind=ACCESS_DENIED,
                actor=actor[:150],
                data={**detail, "suppressed": suppressed},
            )
    except DatabaseError:
        # The refusal stands whatever happens here; only its audit row is lost (and logged).
        log.warning(
            "access denied to %s on fleet %s (%s); audit event not written",
            actor,
            fleet_id,
            detail,
            exc_info=True,
        )
        return False
    return True


def _first_in_window(key: str) -> int | None:
    """Open the denial window of `key` and return how many refusals of it were folded since the
    last recorded one; None when a window is open already (this one is counted, not recorded)."""
    suppressed_key = f"haru:denied:n:{key}"
    if not cache.add(f"haru:denied:w:{key}", 1, timeout=DENIAL_AUDIT_WINDOW_S):
        # Kept ten windows: a key refused again after a quiet spell still reports the fold.
        if not cache.add(suppressed_key, 1, timeout=DENIAL_AUDIT_WINDOW_S * 10):
            cache.incr(suppressed_key)
        return None
    suppressed = cache.get(suppressed_key) or 0
    cache.delete(suppressed_key)
    return int(suppressed)
