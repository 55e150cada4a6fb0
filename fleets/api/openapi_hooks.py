"""drf-spectacular postprocessing hooks (SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]).

The chat proxy's OpenAI-compatible paths are served by haru/asgi.py ahead of Django
(fleets/proxy/), so no DRF view describes them; `add_chat_proxy_paths` writes them into the
schema, so the page lists every path a client can call. The API does not import the proxy (both
are entry points): tests/api/test_api_openapi.py holds CHAT_PATHS to fleets/proxy/handler.py's
ENDPOINTS, so a path added to the proxy without its description fails there.
`describe_path_parameters` says what the URL's `{ref}`, `{domain}` and `{operation_id}` accept,
once for every route.
"""

from __future__ import annotations

import copy
from typing import Any

from fleets.base.errors import ErrorCode

JSON = "application/json"
MODEL_PREFIX = "/v1/models/"  # GET /v1/models/{model} (fleets/proxy/handler.py)
ERROR = {"$ref": "#/components/schemas/ErrorEnvelope"}

PATH_PARAMETERS = {
    "ref": "The fleet: its id (UUID) or its slug (`demo`); an id is tried first.",
    "domain": "A domain of the fleet: its id (UUID) or its slug (`east`).",
    "operation_id": "The operation's id (UUID), as the promote, demote or drill answer gave it.",
    "rollout_id": "The rollout's id (UUID), as the answer that started it gave it.",
    "action": "What to do to the rollout: pause, resume, promote (early) or abort.",
    "name": "An adapter's name, as clients send it as `model` (`support-bot`).",
}


def describe_path_parameters(result: dict, **_kwargs: Any) -> dict:
    """Give every `{ref}`, `{domain}` and `{operation_id}` path parameter its description."""
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", ()):
                text = PATH_PARAMETERS.get(parameter["name"])
                if parameter.get("in") == "path" and text and "description" not in parameter:
                    parameter["description"] = text
    return result


CHAT_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": "HARU_API_TOKEN (the operator token) or one of HARU_CHAT_TOKENS (a chat "
    "token): the chat proxy takes either; with no token configured (local development) it "
    "takes none. The token never reaches a model server.",
}

FLEET_HEADER = {
    "name": "X-Haru-Fleet",
    "in": "header",
    "required": False,
    "schema": {"type": "string"},
    "description": "The fleet (slug or UUID) whose active domain serves the request; "
    "HARU_DEFAULT_FLEET when absent.",
}

RETRY_AFTER = {
    "Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait first."}
}
STALE = {
    "X-Haru-Routing": {
        "schema": {"type": "string", "enum": ["stale"]},
        "description": "Present when the state store is down and the last route seen was used.",
    }
}


def _openai_request(what: str, field: str, schema: dict) -> dict:
    """An OpenAI request body as the proxy takes it: forwarded byte for byte (vendor fields
    survive), of which Haru reads `model` only; `field` is the request's own content."""
    return {
        "type": "object",
        "description": f"An OpenAI {what} request, forwarded byte for byte (vendor fields "
        "survive); Haru reads `model` only.",
        "required": ["model", field],
        "additionalProperties": True,
        "properties": {
            "model": {
                "type": "string",
                "minLength": 1,
                "description": "A model name bound on the fleet's active domain (exact).",
            },
            field: schema,
            "stream": {"type": "boolean", "description": "Server-sent events when true."},
        },
    }


CHAT_REQUEST = _openai_request(
    "chat completion",
    "messages",
    {"type": "array", "items": {"type": "object", "additionalProperties": True}},
)
COMPLETION_REQUEST = _openai_request(
    "(legacy) completion",
    "prompt",
    {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
)
MODEL = {
    "type": "object",
    "required": ["id", "object", "created", "owned_by"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["model"]},
        "created": {"type": "integer"},
        "owned_by": {"type": "string", "enum": ["haru"]},
    },
}
MODEL_LIST = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {
        "object": {"type": "string", "enum": ["list"]},
        "data": {"type": "array", "items": {"$ref": "#/components/schemas/OpenAIModel"}},
    },
}
COMPONENTS = {
    "OpenAIChatCompletionRequest": CHAT_REQUEST,
    "OpenAICompletionRequest": COMPLETION_REQUEST,
    "OpenAIModel": MODEL,
    "OpenAIModelList": MODEL_LIST,
}


def _error(text: str, *, retry: bool = False) -> dict:
    out: dict = {"description": text, "content": {JSON: {"schema": ERROR}}}
    if retry:
        out["headers"] = RETRY_AFTER
    return out


# The answers every proxied call shares; each path adds its own 200.
COMMON_ERRORS = {
    "400": _error(f"`{ErrorCode.INVALID_REQUEST.value}`: not a JSON object, or no `model`."),
    "401": _error(f"`{ErrorCode.UNAUTHORIZED.value}`: a token is configured and none matched."),
    "404": _error(
        f"`{ErrorCode.FLEET_NOT_FOUND.value}` or `{ErrorCode.MODEL_NOT_FOUND.value}` (the "
        "message lists the models available)."
    ),
    "405": _error("`method_not_allowed`."),
    "503": _error(
        f"`{ErrorCode.NO_ACTIVE_DOMAIN.value}`, `{ErrorCode.MODEL_UNAVAILABLE.value}` (bound "
        "but not serving now, or held past HARU_CHAT_HOLD_MS), `hold_capacity_exceeded`, "
        f"`{ErrorCode.SERVER_DRAINING.value}` or `{ErrorCode.STATE_STORE_UNAVAILABLE.value}`.",
        retry=True,
    ),
}
FORWARDED_ERRORS = {
    "413": _error(f"`{ErrorCode.PAYLOAD_TOO_LARGE.value}`: over HARU_CHAT_MAX_BODY_BYTES."),
    "502": _error(
        f"`{ErrorCode.UPSTREAM_UNREACHABLE.value}`: the model server died mid-request (never "
        "sent twice).",
        retry=True,
    ),
    "504": _error(
        f"`{ErrorCode.UPSTREAM_TIMEOUT.value}`: no response headers within "
        "HARU_CHAT_HEADER_TIMEOUT_MS."
    ),
}


def _forwarded(operation_id: str, summary: str, request: str, answer: str) -> dict:
    """A POST the proxy forwards to the active domain's model server."""
    return {
        "operationId": operation_id,
        "summary": summary,
        "description": f"{summary}, on the fleet's active domain. Requests the active cannot "
        "take (a promotion in flight, a model server refusing or answering 503) are held up to "
        "HARU_CHAT_HOLD_MS and forwarded exactly once when routing moves; the response "
        "streams back as the model server sends it, with its status and content type. "
        "Served by the chat proxy ahead of Django (docs/api.md, 'The chat proxy').",
        "tags": ["chat (OpenAI-compatible)"],
        "parameters": [FLEET_HEADER],
        "requestBody": {
            "required": True,
            "content": {JSON: {"schema": {"$ref": f"#/components/schemas/{request}"}}},
        },
        "responses": {
            "200": {
                "description": f"The model server's {answer}, as it sent it.",
                "headers": STALE,
                "content": {
                    JSON: {"schema": {"type": "object", "additionalProperties": True}},
                    "text/event-stream": {
                        "schema": {
                            "type": "string",
                            "description": "With `stream: true`: `data: {...}` events, then "
                            "`data: [DONE]`.",
                        }
                    },
                },
            },
            **COMMON_ERRORS,
            **FORWARDED_ERRORS,
        },
        "security": [{"bearerToken": []}, {"chatToken": []}],
    }


def _listed(operation_id: str, summary: str, description: str, schema: str) -> dict:
    """A GET the proxy answers itself from the fleet's routing."""
    return {
        "operationId": operation_id,
        "summary": summary,
        "description": description,
        "tags": ["chat (OpenAI-compatible)"],
        "parameters": [FLEET_HEADER],
        "responses": {
            "200": {
                "description": summary,
                "headers": STALE,
                "content": {JSON: {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
            },
            **COMMON_ERRORS,
        },
        "security": [{"bearerToken": []}, {"chatToken": []}],
    }


MODEL_PARAMETER = {
    "name": "model",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "A model name; one holding `/` is served too (the rest of the path).",
}

# One description per endpoint the proxy serves (fleets/proxy/handler.py ENDPOINTS and
# MODEL_PREFIX), in OpenAPI's shape; the tags say they are not Django's.
CHAT_PATHS: dict[str, dict] = {
    "/v1/chat/completions": {
        "post": _forwarded(
            "createChatCompletion",
            "Create a chat completion",
            "OpenAIChatCompletionRequest",
            "chat.completion (or chunks)",
        )
    },
    "/v1/completions": {
        "post": _forwarded(
            "createCompletion",
            "Create a completion",
            "OpenAICompletionRequest",
            "text_completion (or chunks)",
        )
    },
    "/v1/models": {
        "get": _listed(
            "listModels",
            "List the models the fleet serves now",
            "The models the fleet's active domain can serve now, in OpenAI's list format.",
            "OpenAIModelList",
        )
    },
    MODEL_PREFIX + "{model}": {
        "get": {
            **_listed(
                "retrieveModel",
                "Retrieve a model",
                "The model if the fleet's active domain serves it now, by the same rules as a "
                "chat request naming it (404 listing what is available, 503 while it is bound "
                "but not serving).",
                "OpenAIModel",
            ),
            "parameters": [MODEL_PARAMETER, FLEET_HEADER],
        }
    },
}


def add_chat_proxy_paths(result: dict, **_kwargs: Any) -> dict:
    """Add the chat proxy's paths, their shapes and the chat token scheme to the schema."""
    # Copies: the tables are module constants, and a schema is a document its reader may change.
    result.setdefault("paths", {}).update(copy.deepcopy(CHAT_PATHS))
    components = result.setdefault("components", {})
    components.setdefault("schemas", {}).update(copy.deepcopy(COMPONENTS))
    components.setdefault("securitySchemes", {})["chatToken"] = dict(CHAT_SCHEME)
    return result
