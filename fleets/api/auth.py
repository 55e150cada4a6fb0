"""Bearer-token authentication for every /v1/ route.

HARU_API_TOKEN set: a request needs `Authorization: Bearer <token>` (constant-time comparison) or
a logged-in staff session (so operators can use the browsable docs and the dashboard's calls).
A chat token (HARU_CHAT_TOKENS) is refused here with 403: it may call the chat endpoints only.
Unset: the server binds loopback only (see `manage.py serve`) and the API is open.
"""

from __future__ import annotations

from django.conf import settings
from rest_framework import authentication, exceptions, permissions

from fleets.base.errors import ErrorCode
from fleets.base.private_apis import session_user
from fleets.base.tokens import Scope, token_scope


class _Token:
    """The identity of a request that presented the API token."""

    is_authenticated = True
    is_staff = True
    username = "api-token"

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
        if not settings.HARU["api_token"]:
            return None
        header = request.META.get("HTTP_AUTHORIZATION")
        if header is None:
            return None  # maybe a session; the permission decides
        scope = token_scope(header)
        if scope is None:
            raise exceptions.AuthenticationFailed("invalid bearer token")
        if scope is not Scope.OPERATOR:
            raise ChatTokenRefused()
        return (_Token(), "token")

    def authenticate_header(self, request) -> str:
        # Makes DRF answer 401 (not 403) and tell the client which scheme to use.
        return 'Bearer realm="haru"'


class StaffSessionAuthentication(authentication.SessionAuthentication):
    """A logged-in staff user's session, with CSRF enforced on unsafe methods."""

    def authenticate(self, request):
        user = session_user(request)
        if not user or not user.is_active or not user.is_staff:
            return None
        self.enforce_csrf(request)
        return (user, None)


class HasApiToken(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        if not settings.HARU["api_token"]:
            return True
        return bool(request.user and getattr(request.user, "is_authenticated", False))
