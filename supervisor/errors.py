"""The API's error type and the one envelope every error is rendered in."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """Fail a request with an HTTP status and a stable machine-readable code."""

    def __init__(
        self, status: int, code: str, message: str, *, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}

    def body(self) -> dict[str, Any]:
        """Render the `{"error": {"code", "message", ...}}` envelope."""
        return error_body(self.code, self.message, **self.details)


def error_body(code: str, message: str, **details: Any) -> dict[str, Any]:
    """Build the error envelope; extra keys sit beside code and message."""
    return {"error": {"code": code, "message": message, **details}}
