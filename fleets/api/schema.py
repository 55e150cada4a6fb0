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
            "description": "HARU_API_TOKEN, the operator token (operates every fleet), or a "
            "stored token (`haru_...`, `manage.py api_token create`) that reads or operates the "
            "fleets it names: 403 `forbidden` on any other fleet and, for a read token, on "
            "every POST. Required on /v1/ when the server has HARU_API_TOKEN set. A chat token "
            "(HARU_CHAT_TOKENS) is refused here with 403 `token_scope`: it may call the chat "
            "endpoints only. docs/access.md.",
        }


class PortalSessionScheme(OpenApiAuthenticationExtension):
    target_class = "fleets.api.auth.PortalSessionAuthentication"
    name = "portalSession"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "cookie",
            "name": "sessionid",
            "description": "A logged-in portal user's session (browsable docs), with that "
            "user's fleet roles (view, operate, administer; docs/access.md).",
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
