"""Errors the services and selectors raise; each carries the API error code and HTTP status.

`ErrorCode` is every `error.code` the control plane answers in its error envelope
(`{"error": {"code", "message"}}`), from the REST API, the dashboard's JSON answers and the chat
proxy alike. An operation's own failure codes are `fleets.core.states.OperationErrorCode`.

At the bottom of the layers: anything may import it, and it imports nothing of Haru's.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    # The REST API and the dashboard (fleets/api/errors.py maps DRF's and Django's errors).
    INTERNAL_ERROR = "internal_error"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    # A chat token (HARU_CHAT_TOKENS) on a REST route: it may call the chat endpoints only.
    TOKEN_SCOPE = "token_scope"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    NOT_ACCEPTABLE = "not_acceptable"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    INVALID_REQUEST = "invalid_request"
    RATE_LIMITED = "rate_limited"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    DATABASE_UNAVAILABLE = "database_unavailable"
    # A Host header the server does not answer to (fleets/server/hosts.py).
    INVALID_HOST = "invalid_host"
    # The services' own (the ServiceError subclasses).
    FLEET_NOT_FOUND = "fleet_not_found"
    OPERATION_NOT_FOUND = "operation_not_found"
    INVALID_TARGET = "invalid_target"
    OPERATION_CONFLICT = "operation_conflict"
    INVALID_LAYOUT = "invalid_layout"
    OPERATION_FINISHED = "operation_finished"
    # A cancel in the instant between a promotion's switch and its record: retry it.
    ROUTING_COMMITTED = "routing_committed"
    SUPERVISOR_UNAVAILABLE = "supervisor_unavailable"
    PROVISION_REFUSED = "provision_refused"
    # Rollouts (fleets/services/rollouts.py).
    ROLLOUT_NOT_FOUND = "rollout_not_found"
    ROLLOUT_CONFLICT = "rollout_conflict"
    # Adapters (fleets/services/adapter_pins.py, the adapters' reads).
    ADAPTER_NOT_FOUND = "adapter_not_found"
    # A layout that would write back the version a finished rollout moved a model away from.
    LAYOUT_BEHIND_ROLLOUT = "layout_behind_rollout"
    # The chat proxy (fleets/proxy/errors.py); it also answers unauthorized, invalid_request,
    # payload_too_large, fleet_not_found and method_not_allowed.
    MODEL_NOT_FOUND = "model_not_found"
    MODEL_UNAVAILABLE = "model_unavailable"
    NO_ACTIVE_DOMAIN = "no_active_domain"
    STATE_STORE_UNAVAILABLE = "state_store_unavailable"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    UPSTREAM_UNREACHABLE = "upstream_unreachable"
    HOLD_CAPACITY_EXCEEDED = "hold_capacity_exceeded"
    SERVER_DRAINING = "server_draining"
    # An adapter's name with no version loaded and probed where it would be served.
    ADAPTER_NOT_READY = "adapter_not_ready"


class ServiceError(Exception):
    code: str = ErrorCode.INTERNAL_ERROR
    status = 500

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code:
            self.code = code


class FleetNotFound(ServiceError):
    code = ErrorCode.FLEET_NOT_FOUND
    status = 404


class OperationNotFound(ServiceError):
    code = ErrorCode.OPERATION_NOT_FOUND
    status = 404


class InvalidTarget(ServiceError):
    code = ErrorCode.INVALID_TARGET
    status = 422


class OperationConflict(ServiceError):
    code = ErrorCode.OPERATION_CONFLICT
    status = 409

    def __init__(self, message: str, *, operation: Any = None) -> None:
        # The in-flight Operation row (a model: this module imports nothing of Haru's).
        super().__init__(message)
        self.operation = operation


# What a layout refusal reports: the first errors, each cut to a length, then how many more.
# A 20,000-model layout can break a rule 20,000 times; the operator fixes the first ones and
# applies again, and the report (a terminal, an API answer, an admin page) stays small.
MAX_REPORTED_ERRORS = 50
MAX_ERROR_CHARS = 500


def bounded_errors(errors: list[str]) -> list[str]:
    """At most MAX_REPORTED_ERRORS of `errors`, each at most MAX_ERROR_CHARS, then a line
    saying how many more were found."""
    shown = [
        e if len(e) <= MAX_ERROR_CHARS else e[: MAX_ERROR_CHARS - 1] + "…"
        for e in errors[:MAX_REPORTED_ERRORS]
    ]
    more = len(errors) - MAX_REPORTED_ERRORS
    if more > 0:
        shown.append(f"(layout): and {more} more error(s) not shown; fix these and check again")
    return shown


class LayoutError(ServiceError):
    """A layout that fails validation; `errors` lists the `path: rule` found (bounded:
    `bounded_errors`)."""

    code = ErrorCode.INVALID_LAYOUT
    status = 422

    def __init__(self, errors: list[str], *, batches_written: int = 0) -> None:
        errors = bounded_errors(errors)
        super().__init__("; ".join(errors))
        self.errors = errors
        # Batches an apply had committed before it stopped (a partial apply; re-apply completes).
        self.batches_written = batches_written


class LayoutRolloutConflict(LayoutError):
    """A layout apply that would change a domain, slot or model of a fleet with a rollout in
    flight: the rollout holds the standby and moves its binding; nothing is written."""

    code = ErrorCode.ROLLOUT_CONFLICT
    status = 409


class LayoutBehindRollout(LayoutError):
    """A layout apply that would put back, in the database, the profile or serving URL a
    finished rollout moved a model away from (the hosts serve the new one); nothing is written
    unless the apply says `revert_rollout` (docs/rollouts.md, "Layouts and rollouts")."""

    code = ErrorCode.LAYOUT_BEHIND_ROLLOUT
    status = 409


class OperationNotCancellable(ServiceError):
    """A cancel that came too late: the operation finished, or it moved routing a moment ago
    and its switch is still being recorded (retry: it then ends without its best-effort steps).

    `code` says which (`operation_finished`, `routing_committed`); `operation` is the row.
    """

    code = ErrorCode.OPERATION_FINISHED
    status = 409

    def __init__(self, message: str, *, code: str | None = None, operation: Any = None) -> None:
        super().__init__(message, code=code)
        self.operation = operation


class SupervisorUnavailable(ServiceError):
    """A request that needs a supervisor's answer did not get one (unreachable, timed out)."""

    code = ErrorCode.SUPERVISOR_UNAVAILABLE
    status = 502


class InvalidRequest(ServiceError):
    """A request body a service refuses, nothing changed; `field` names the part at fault."""

    code = ErrorCode.INVALID_REQUEST
    status = 400

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class RolloutNotFound(ServiceError):
    code = ErrorCode.ROLLOUT_NOT_FOUND
    status = 404


class AdapterNotFound(ServiceError):
    """An adapter name, or a version of it, the fleet's registry does not hold."""

    code = ErrorCode.ADAPTER_NOT_FOUND
    status = 404


class RolloutConflict(ServiceError):
    """A rollout request or action the rollout's state (or the fleet's) does not allow now:
    another rollout or an operation in flight, an action its state refuses."""

    code = ErrorCode.ROLLOUT_CONFLICT
    status = 409
