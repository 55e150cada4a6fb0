"""drf-spectacular extensions: Haru's authentication schemes, and closed request bodies."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiSerializerExtension

from fleets.base.private_apis import serializer_schema


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


class StrictSerializerSchema(OpenApiSerializerExtension):
    """A strict serializer refuses fields it does not name (400); its schema says so, so a
    client generated from the schema and the server agree (`additionalProperties: false`)."""

    target_class = "fleets.api.serializers.StrictSerializer"
    match_subclasses = True

    def map_serializer(self, auto_schema, direction):
        schema = serializer_schema(auto_schema, self.target, direction)
        schema["additionalProperties"] = False
        return schema
