"""Bearer-token authentication and per-fleet access for every /v1/ route.

HARU_API_TOKEN set: a request needs `Authorization: Bearer <token>` or a logged-in user's
session (so operators can use the browsable docs). Three kinds of token: the operator token
(HARU_API_TOKEN, constant-time comparison) operates every fleet; a stored token (`haru_...`,
`manage.py api_token`) reads or operates the fleets it names; a chat token (HARU_CHAT_TOKENS)
is refused here with 403, it may call the chat endpoints only. A session user holds the roles
of fleets/reads/access.py. `FleetRole` then checks the role a request needs on the fleet it
names (fleets/core/access.py): 403 `forbidden`, audited as an `access.denied` event, when it
falls short, and 403 as well for a fleet the principal cannot see, whether or not it exists,
so a scoped token cannot map the other fleets' names.
Unset: the server binds loopback only (see `manage.py serve`) and the API is open.
"""

from __future__ import annotations

from rest_framework import authentication, exceptions, permissions

from fleets.base import clock
from fleets.base.conf import haru_settings
from fleets.base.errors import ErrorCode, ServiceError
from fleets.base.private_apis import session_user
from fleets.base.tokens import Scope, token_scope
from fleets.core.access import FULL_ACCESS, AccessGrant, Role, method_role
from fleets.reads import selectors
from fleets.reads.access import principal_label, stored_token, user_grant
from fleets.services.access import access_denied_record, api_token_touch


class _Token:
    """The identity of a request that presented the API token."""

    is_authenticated = True
    is_active = True
    is_staff = False
    username = "api-token"
    # The operator token moves every fleet; layouts and access are changed by people.
    access_grant = AccessGrant(all_fleets=Role.OPERATE)

    def __str__(self) -> str:
        return self.username


class ChatTokenRefused(exceptions.PermissionDenied):
    """A valid token of the wrong scope: known, so 403 (not 401), and saying which is needed."""

    default_code = ErrorCode.TOKEN_SCOPE
    default_detail = (
        "this token may only call the chat endpoints (/v1/chat/completions, /v1/completions, "
        "/v1/models); the REST API needs the operator token (HARU_API_TOKEN)"
    )


class BearerTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        if not haru_settings().api_token:
            return None
        header = request.META.get("HTTP_AUTHORIZATION")
        if header is None:
            return None  # maybe a session; the permission decides
        scope = token_scope(header)
        if scope is None:
            stored = stored_token(header)
            if stored is None:
                raise exceptions.AuthenticationFailed("invalid bearer token")
            now = clock.now()
            if stored.touch_due(now):
                api_token_touch(token_id=stored.token_id, now=now)
            return (stored, "stored-token")
        if scope is not Scope.OPERATOR:
            match = request.resolver_match
            access_denied_record(
                fleet_id=None,
                actor="api:chat-token",
                surface="api",
                # The route's name, not its path: a scan of paths is one key, not one a path.
                action=f"{request.method} {match.url_name if match else 'unknown'}",
                needed=Role.VIEW,
                held=Role.NONE,
            )
            raise ChatTokenRefused()
        return (_Token(), "token")

    def authenticate_header(self, request) -> str:
        # Makes DRF answer 401 (not 403) and tell the client which scheme to use.
        return 'Bearer realm="haru"'


class PortalSessionAuthentication(authentication.SessionAuthentication):
    """A logged-in user's session, with CSRF enforced on unsafe methods.

    Only a user who may view at least one fleet is authenticated (anyone else is answered 401,
    as an anonymous caller); what the user may do to each fleet is `FleetRole`'s to decide.
    """

    def authenticate(self, request):
        user = session_user(request)
        if not user or not user.is_active or not user_grant(user).is_member:
            return None
        self.enforce_csrf(request)
        return (user, None)


class HasApiToken(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        if not haru_settings().api_token:
            return True
        return bool(request.user and getattr(request.user, "is_authenticated", False))


class FleetForbidden(exceptions.PermissionDenied):
    """The principal lacks the role this request needs on the fleet it names."""

    default_code = ErrorCode.FORBIDDEN


def request_grant(request) -> AccessGrant:
    """What the caller may do: everything while the API is open (no HARU_API_TOKEN: loopback
    only), else the roles of the token or user that authenticated."""
    if not haru_settings().api_token:
        return FULL_ACCESS
    return user_grant(request.user)


def _fleet_id_named(view) -> str | None:
    """The id of the fleet the route names (by `ref`, or by an operation's id), or None when
    it names none that exists."""
    kwargs = view.kwargs
    try:
        if "ref" in kwargs:
            return str(selectors.fleet_get(kwargs["ref"]).pk)
        return str(selectors.operation_get(kwargs["operation_id"]).fleet_id)
    except ServiceError:
        return None


class FleetRole(permissions.BasePermission):
    """Refuse a request on a fleet the caller may not read (GET) or operate (POST)."""

    def has_permission(self, request, view) -> bool:
        if "ref" not in view.kwargs and "operation_id" not in view.kwargs:
            return True  # fleet lists are narrowed by the view; the schema names no fleet
        grant = request_grant(request)
        needed = getattr(view, "required_role", None) or method_role(request.method)
        fleet_id = _fleet_id_named(view)
        if fleet_id is None and grant.sees_every_fleet:
            return True  # the view answers 404: this caller may know what exists
        if fleet_id is not None and grant.allows(fleet_id, needed):
            return True
        held = grant.role(fleet_id) if fleet_id is not None else Role.NONE
        match = request.resolver_match
        access_denied_record(
            fleet_id=fleet_id,
            actor=f"api:{principal_label(request.user)}",
            surface="api",
            action=f"{request.method} {match.url_name if match else 'unknown'}",
            needed=needed,
            held=held,
        )
        ref = view.kwargs.get("ref") or view.kwargs.get("operation_id")
        raise FleetForbidden(f"no {needed.label} access to {ref!r} for this caller")
