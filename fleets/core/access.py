"""Who may do what to which fleet: roles, token scopes, and the role every action needs.

Three roles, each including the one before: `view` (read a fleet's pages and API, watch it
live), `operate` (move it: promote, demote, drill, cancel, reconcile, record baselines,
provision or stop a domain) and `administer` (change its layout, delete it, manage who has
access). A principal (a user, an API token) holds one role for every fleet (`all_fleets`) and
possibly a higher one on some fleets (`per_fleet`); what it may do to a fleet is the higher of
the two. The persistence of roles (Django permissions, django-guardian rows, API token rows)
is `fleets/reads/access.py`; this module decides only.

docs/access.md is the operator's account of the same rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum


class Role(IntEnum):
    """A principal's standing on a fleet; a higher role includes every lower one."""

    NONE = 0
    VIEW = 1
    OPERATE = 2
    ADMINISTER = 3

    @property
    def label(self) -> str:
        return self.name.lower()


# The permission codename (app `fleets`, model Fleet) that grants each role; `view_fleet` is
# Django's default model permission, the other two are declared in Fleet.Meta.permissions.
ROLE_PERMISSIONS: Mapping[Role, str] = {
    Role.VIEW: "view_fleet",
    Role.OPERATE: "operate_fleet",
    Role.ADMINISTER: "administer_fleet",
}


def role_of_codenames(codenames: set[str] | frozenset[str]) -> Role:
    """The highest role the permission `codenames` grant (Role.NONE for none of them)."""
    held = [role for role, codename in ROLE_PERMISSIONS.items() if codename in codenames]
    return max(held, default=Role.NONE)


# Every stored token is this prefix and 32 random bytes, URL-safe base64 without padding
# (`secrets.token_urlsafe(32)`: 43 characters), so a header that cannot be one costs no query,
# and the edge can tell a stored token's shape without the database (fleets/server/body_gate.py).
STORED_TOKEN_PREFIX = "haru_"
_STORED_TOKEN_RANDOM = 43
_URLSAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def stored_token_shaped(secret: str) -> bool:
    """Whether `secret` has a stored token's shape (not whether one with it exists)."""
    random = secret[len(STORED_TOKEN_PREFIX) :]
    return (
        secret.startswith(STORED_TOKEN_PREFIX)
        and len(random) == _STORED_TOKEN_RANDOM
        and _URLSAFE.issuperset(random)
    )


class TokenScope(StrEnum):
    """What an API token stored in the database may do on the fleets it covers."""

    READ = "read"
    OPERATE = "operate"


# A token never administers: layouts, deletion and access are changed by people, in the admin
# or with a management command, so a leaked token cannot widen its own reach.
TOKEN_ROLES: Mapping[TokenScope, Role] = {
    TokenScope.READ: Role.VIEW,
    TokenScope.OPERATE: Role.OPERATE,
}


@dataclass(frozen=True)
class AccessGrant:
    """What one principal may do: `all_fleets` on every fleet, `per_fleet` (fleet id as text)
    on the fleets named there. A role in `per_fleet` below `all_fleets` changes nothing."""

    all_fleets: Role = Role.NONE
    per_fleet: Mapping[str, Role] = field(default_factory=dict)

    def role(self, fleet_id: object) -> Role:
        return max(self.all_fleets, self.per_fleet.get(str(fleet_id), Role.NONE))

    def allows(self, fleet_id: object, needed: Role) -> bool:
        return self.role(fleet_id) >= needed

    @property
    def sees_every_fleet(self) -> bool:
        """Whether it may view any fleet that exists (then a missing fleet is a 404 to it)."""
        return self.all_fleets >= Role.VIEW

    @property
    def is_member(self) -> bool:
        """Whether it may view at least one fleet (the portal admits only such users)."""
        return self.sees_every_fleet or any(r >= Role.VIEW for r in self.per_fleet.values())

    def visible_ids(self) -> frozenset[str] | None:
        """The ids of the fleets it may view; None when it may view every fleet."""
        if self.sees_every_fleet:
            return None
        return frozenset(fid for fid, role in self.per_fleet.items() if role >= Role.VIEW)


FULL_ACCESS = AccessGrant(all_fleets=Role.ADMINISTER)
NO_ACCESS = AccessGrant()


def token_grant(scope: TokenScope, fleet_ids: list[str] | None) -> AccessGrant:
    """The grant of a stored API token: its scope's role on `fleet_ids` (None: every fleet)."""
    role = TOKEN_ROLES[scope]
    if fleet_ids is None:
        return AccessGrant(all_fleets=role)
    return AccessGrant(per_fleet=dict.fromkeys(fleet_ids, role))


# The role every portal action needs (fleets/dashboard/forms.py ACTIONS; a test checks both
# lists name the same actions, so a new button cannot be added without deciding its role).
DASHBOARD_ACTION_ROLES: Mapping[str, Role] = {
    "promote": Role.OPERATE,
    "demote": Role.OPERATE,
    "reconcile": Role.OPERATE,
    "provision": Role.OPERATE,
    "stop": Role.OPERATE,
    "cancel": Role.OPERATE,
    "drill": Role.OPERATE,
    "baseline": Role.OPERATE,
    "rollout-pause": Role.OPERATE,
    "rollout-resume": Role.OPERATE,
    "rollout-promote": Role.OPERATE,
    "rollout-abort": Role.OPERATE,
}

# Reads answer to `view`; every write of the REST API moves a fleet (none edits a layout), so
# it needs `operate`. Keyed by HTTP method: an API view can override with its own table.
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def method_role(method: str) -> Role:
    """The role an API request with `method` needs on the fleet it names."""
    return Role.VIEW if method.upper() in _SAFE_METHODS else Role.OPERATE


# How long one principal's denials of one action on one fleet share a single audit event: the
# first is recorded at once, the rest are counted and reported by the next event of that key
# (data.suppressed), so a client hammering a forbidden endpoint adds at most one event a window.
DENIAL_AUDIT_WINDOW_S = 60

# How often a stored token's last_used_at is written: often enough to tell a live token from a
# dead one, rarely enough that a busy token is not a write per request.
TOKEN_TOUCH_EVERY_S = 60
