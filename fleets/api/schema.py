"""OpenAPI descriptions of Haru's authentication schemes (drf-spectacular extensions)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "fleets.api.auth.BearerTokenAuthentication"
    name = "bearerToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "HARU_API_TOKEN, the operator token (required on /v1/ when the "
            "server has one set). A chat token (HARU_CHAT_TOKENS) is refused here with 403 "
            "`token_scope`: it may call the chat endpoints only.",
        }


class StaffSessionScheme(OpenApiAuthenticationExtension):
    target_class = "fleets.api.auth.StaffSessionAuthentication"
    name = "staffSession"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "cookie",
            "name": "sessionid",
            "description": "A logged-in staff user's session (dashboard, browsable docs).",
        }
