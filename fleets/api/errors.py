"""Every API error in one envelope: `{"error": {"code": "...", "message": "..."}}`."""

from __future__ import annotations

import sys

from django.core.exceptions import RequestDataTooBig
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response

from fleets.base import store_outage as outage
from fleets.base.errors import ErrorCode, ServiceError
from fleets.reads.shapes import operation_json

_CODES: dict[type, str] = {
    exceptions.NotAuthenticated: ErrorCode.UNAUTHORIZED,
    exceptions.AuthenticationFailed: ErrorCode.UNAUTHORIZED,
    exceptions.PermissionDenied: ErrorCode.FORBIDDEN,
    exceptions.NotFound: ErrorCode.NOT_FOUND,
    exceptions.MethodNotAllowed: ErrorCode.METHOD_NOT_ALLOWED,
    exceptions.NotAcceptable: ErrorCode.NOT_ACCEPTABLE,
    exceptions.UnsupportedMediaType: ErrorCode.UNSUPPORTED_MEDIA_TYPE,
    exceptions.ParseError: ErrorCode.INVALID_REQUEST,
    exceptions.ValidationError: ErrorCode.INVALID_REQUEST,
    exceptions.Throttled: ErrorCode.RATE_LIMITED,
}


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "request body too large"
    default_code = ErrorCode.PAYLOAD_TOO_LARGE


def envelope(code: str, message: str, status_code: int, **extra) -> Response:
    return Response({"error": {"code": code, "message": message, **extra}}, status=status_code)


def _flatten(detail, prefix: str = "") -> list[str]:
    """Turn DRF's nested validation detail into `field: message` lines."""
    if isinstance(detail, dict):
        out = []
        for key, value in detail.items():
            name = "body" if key == "non_field_errors" else f"{prefix}{key}"
            out += (
                _flatten(value, f"{name}.")
                if isinstance(value, dict)
                else [f"{name}: {msg}" for msg in (value if isinstance(value, list) else [value])]
            )
        return out
    if isinstance(detail, list):
        return [str(d) for d in detail]
    return [str(detail)]


def envelope_exception_handler(exc, context):
    """DRF exception handler: map every error, DRF's own included, to the envelope."""
    if outage.is_database_outage(exc):
        outage.note(exc)
        return outage.json_response()
    if isinstance(exc, ServiceError):
        response = envelope(exc.code, exc.message, exc.status)
        field = getattr(exc, "field", "")
        if field:
            # The part of the body at fault, as a client can point at it.
            response.data["error"]["field"] = field
        operation = getattr(exc, "operation", None)
        if operation is not None:
            response.data["error"]["operation"] = operation_json(operation)
        return response
    if isinstance(exc, RequestDataTooBig):
        return envelope(ErrorCode.PAYLOAD_TOO_LARGE, "request body too large", 413)
    if isinstance(exc, Http404):
        return envelope(ErrorCode.NOT_FOUND, str(exc) or "not found", 404)
    if isinstance(exc, exceptions.APIException):
        # Exact types only: a subclass (ChatTokenRefused) keeps its own, more precise code.
        code = _CODES.get(type(exc)) or getattr(exc, "default_code", "error")
        if isinstance(exc, exceptions.ValidationError):
            message = "; ".join(_flatten(exc.detail))
        else:
            message = str(exc.detail)
        response = envelope(str(code), message, exc.status_code)
        if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
            response["WWW-Authenticate"] = 'Bearer realm="haru"'
        return response
    return None  # unexpected: Django logs it and the 500 handler renders the envelope


def json_not_found(request, exception=None):
    """handler404 for the whole site: JSON envelope for API paths."""
    return JsonResponse(
        {"error": {"code": ErrorCode.NOT_FOUND, "message": f"no route for {request.path}"}},
        status=404,
    )


def json_server_error(request):
    """handler500 for the whole site; a database outage is a 503 instead (JSON for the API and
    metrics, a short HTML page for the dashboard and admin)."""
    exc = sys.exc_info()[1]  # Django calls this inside its `except` block
    if outage.is_database_outage(exc):
        assert exc is not None
        outage.note(exc)
        if request.path.startswith(("/v1/", "/metrics")):
            return outage.json_response()
        return outage.html_response()
    return JsonResponse(
        {"error": {"code": ErrorCode.INTERNAL_ERROR, "message": "internal server error"}},
        status=500,
    )
