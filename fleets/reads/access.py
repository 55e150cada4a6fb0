"""Read who holds which role (fleets/core/access.py decides what the roles allow).

A user's grant: every role for a superuser; the model permissions (`fleets.view_fleet`,
`fleets.operate_fleet`, `fleets.administer_fleet`, held directly or through a group) for every
fleet; django-guardian's object permissions (directly or through a group) for single fleets.
`is_staff` grants nothing here: it only lets a user into the Django admin, whose own model
permissions still apply there.

A stored API token's grant: its scope on its fleets (or all). The operator token
(HARU_API_TOKEN) operates every fleet.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db.models import QuerySet
from guardian.models import GroupObjectPermission, UserObjectPermission

from common.bearer import bearer_credential
from fleets.core.access import (
    FULL_ACCESS,
    NO_ACCESS,
    ROLE_PERMISSIONS,
    TOKEN_TOUCH_EVERY_S,
    AccessGrant,
    TokenScope,
    role_of_codenames,
    stored_token_shaped,
    token_grant,
)
from fleets.models import ApiToken, Fleet

# The cache of a user's grant on the user object (one request, one socket): roles are read once.
_GRANT_ATTR = "_haru_access_grant"


def secret_digest(secret: str) -> str:
    """The SHA-256 (hex) under which a stored token's secret is kept and looked up."""
    return hashlib.sha256(secret.encode()).hexdigest()


class TokenPrincipal:
    """The identity of a request that presented a stored API token (DRF's `request.user`)."""

    is_authenticated = True
    is_active = True
    is_staff = False
    is_superuser = False

    def __init__(
        self,
        *,
        token_id: int,
        name: str,
        prefix: str,
        grant: AccessGrant,
        last_used_at: datetime | None = None,
    ) -> None:
        self.token_id = token_id
        self.username = f"token:{name}"
        self.prefix = prefix
        self.access_grant = grant
        self.last_used_at = last_used_at

    def touch_due(self, now: datetime) -> bool:
        """Whether its last use is older than the touch interval (so worth writing)."""
        last = self.last_used_at
        return last is None or now - last >= timedelta(seconds=TOKEN_TOUCH_EVERY_S)

    def __str__(self) -> str:
        return self.username

    def get_username(self) -> str:
        return self.username


def stored_token(header: str | None) -> TokenPrincipal | None:
    """The live stored token an Authorization header carries, or None."""
    secret = bearer_credential(header)
    if secret is None or not stored_token_shaped(secret):
        return None
    row = (
        ApiToken.objects.filter(secret_sha256=secret_digest(secret), revoked_at__isnull=True)
        .prefetch_related("fleets")
        .first()
    )
    if row is None:
        return None
    fleet_ids = None if row.all_fleets else [str(f.pk) for f in row.fleets.all()]
    grant = token_grant(TokenScope(row.scope), fleet_ids)
    return TokenPrincipal(
        token_id=row.pk,
        name=row.name,
        prefix=row.prefix,
        grant=grant,
        last_used_at=row.last_used_at,
    )


def user_grant(user: Any) -> AccessGrant:
    """The grant of a Django user (or of no one: an anonymous or inactive user holds none)."""
    if user is None or not getattr(user, "is_authenticated", False):
        return NO_ACCESS
    grant = getattr(user, "access_grant", None)
    if isinstance(grant, AccessGrant):
        return grant  # a token principal
    cached = getattr(user, _GRANT_ATTR, None)
    if cached is not None:
        return cached
    grant = _read_user_grant(user)
    setattr(user, _GRANT_ATTR, grant)
    return grant


def _read_user_grant(user: Any) -> AccessGrant:
    if not user.is_active:
        return NO_ACCESS
    if user.is_superuser:
        return FULL_ACCESS
    model_perms = {
        p.split(".", 1)[1] for p in user.get_all_permissions() if p.startswith("fleets.")
    }
    codenames = list(ROLE_PERMISSIONS.values())
    fleet_type = ContentType.objects.get_for_model(Fleet)
    rows = [
        *UserObjectPermission.objects.filter(
            user=user, content_type=fleet_type, permission__codename__in=codenames
        ).values_list("object_pk", "permission__codename"),
        *GroupObjectPermission.objects.filter(
            group__user=user, content_type=fleet_type, permission__codename__in=codenames
        ).values_list("object_pk", "permission__codename"),
    ]
    per_fleet: dict[str, set[str]] = {}
    for object_pk, codename in rows:
        per_fleet.setdefault(str(object_pk), set()).add(codename)
    return AccessGrant(
        all_fleets=role_of_codenames(model_perms),
        per_fleet={pk: role_of_codenames(names) for pk, names in per_fleet.items()},
    )


def visible_fleets(grant: AccessGrant, fleets: QuerySet[Fleet] | None = None) -> QuerySet[Fleet]:
    """`fleets` (default: all) narrowed to those the grant may view."""
    fleets = Fleet.objects.all() if fleets is None else fleets
    ids = grant.visible_ids()
    return fleets if ids is None else fleets.filter(pk__in=list(ids))


def principal_label(principal: Any) -> str:
    """How a principal is named in audit events and logs (never a secret)."""
    if principal is None:
        return "anonymous"
    if isinstance(principal, TokenPrincipal):
        return f"{principal.username} ({principal.prefix}…)"
    name = principal.get_username() if hasattr(principal, "get_username") else str(principal)
    return str(name) or "anonymous"
