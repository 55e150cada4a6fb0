"""Errors the services and selectors raise; each carries the API error code and HTTP status.

At the bottom of the layers: anything may import it, and it imports nothing of Haru's.
"""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    code = "internal_error"
    status = 500

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code:
            self.code = code


class FleetNotFound(ServiceError):
    code = "fleet_not_found"
    status = 404


class OperationNotFound(ServiceError):
    code = "operation_not_found"
    status = 404


class InvalidTarget(ServiceError):
    code = "invalid_target"
    status = 422


class OperationConflict(ServiceError):
    code = "operation_conflict"
    status = 409

    def __init__(self, message: str, *, operation: Any = None) -> None:
        # The in-flight Operation row (a model: this module imports nothing of Haru's).
        super().__init__(message)
        self.operation = operation


class LayoutError(ServiceError):
    """A layout that fails validation; `errors` lists every `path: rule` found."""

    code = "invalid_layout"
    status = 422

    def __init__(self, errors: list[str], *, batches_written: int = 0) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors
        # Batches an apply had committed before it stopped (a partial apply; re-apply completes).
        self.batches_written = batches_written


class OperationNotCancellable(ServiceError):
    """A cancel that came too late: the operation finished, or it moved routing a moment ago
    and its switch is still being recorded (retry: it then ends without its best-effort steps).

    `code` says which (`operation_finished`, `routing_committed`); `operation` is the row.
    """

    code = "operation_finished"
    status = 409

    def __init__(self, message: str, *, code: str | None = None, operation: Any = None) -> None:
        super().__init__(message, code=code)
        self.operation = operation


class SupervisorUnavailable(ServiceError):
    """A request that needs a supervisor's answer did not get one (unreachable, timed out)."""

    code = "supervisor_unavailable"
    status = 502
