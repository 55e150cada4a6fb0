"""The proxy's endpoints as plain async Django views: the baseline `--compare-django` measures.

Haru serves these paths only with the lean ASGI app (`fleets.proxy.asgi`), ahead of Django;
this module is not shipped. It keeps the comparison that justifies that choice re-measurable:
the same proxy code (`fleets.proxy.handler`) behind Django's own ASGI handler and middleware,
with the body read in full before a view runs. `bench/django_settings.py` serves it.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpResponse, StreamingHttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from fleets.proxy import errors, handler
from fleets.proxy.errors import ProxyError


def _headers(request) -> dict[bytes, bytes]:
    return {
        name.lower().encode("latin-1"): value.encode("latin-1")
        for name, value in request.headers.items()
    }


def _error(err: ProxyError, exchange: handler.Exchange) -> HttpResponse:
    exchange.outcome = err.code
    exchange.record()
    response = HttpResponse(err.body(), status=err.status, content_type="application/json")
    for name, value in err.headers:
        response[name.decode()] = value.decode()
    if exchange.stale:
        response[handler.STALE_HEADER[0].decode()] = handler.STALE_HEADER[1].decode()
    return response


async def _forward(request, endpoint: str):
    exchange = handler.Exchange()
    try:
        if request.method != "POST":
            raise errors.method_not_allowed("POST")
        headers = _headers(request)
        handler.authorize(request.headers.get("Authorization"))
        limit = settings.HARU["chat_max_body_bytes"]
        handler.check_content_length(request.headers.get("Content-Length"), limit)
        body = request.read(limit + 1)
        if len(body) > limit:
            raise errors.payload_too_large(limit)
        upstream_response = await handler.forward(
            headers=headers, body=body, endpoint=endpoint, exchange=exchange
        )
    except ProxyError as err:
        return _error(err, exchange)

    async def relay():
        # Django cancels this iterator when the client disconnects; closing the upstream
        # response then closes its connection, which is how the model server learns of it.
        try:
            async for chunk in upstream_response.aiter_raw():
                exchange.first_byte()
                yield chunk
        finally:
            await upstream_response.aclose()
            exchange.record()

    response = StreamingHttpResponse(relay(), status=upstream_response.status)
    for name, value in handler.response_headers(upstream_response, exchange):
        if name != b"content-length":  # Django streams chunked
            response[name.decode("latin-1")] = value.decode("latin-1")
    return response


@csrf_exempt
async def chat_completions(request):
    """POST /v1/chat/completions through Django (see the module docstring)."""
    return await _forward(request, "chat")


@csrf_exempt
async def completions(request):
    """POST /v1/completions through Django (see the module docstring)."""
    return await _forward(request, "completions")


async def models(request):
    """GET /v1/models through Django (see the module docstring)."""
    exchange = handler.Exchange()
    try:
        if request.method != "GET":
            raise errors.method_not_allowed("GET")
        handler.authorize(request.headers.get("Authorization"))
        body = await handler.models(headers=_headers(request), exchange=exchange)
    except ProxyError as err:
        return _error(err, exchange)
    exchange.record()
    response = HttpResponse(body, content_type="application/json")
    if exchange.stale:
        response[handler.STALE_HEADER[0].decode()] = handler.STALE_HEADER[1].decode()
    return response


urlpatterns = [
    path("v1/chat/completions", chat_completions),
    path("v1/completions", completions),
    path("v1/models", models),
]
