"""The demo's event stream: one line per event, repeated retries folded into a count."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

from haru.demo import RetryFold

BLOB = 'wake: {\n  "error": {\n    "code": "wake_failed"\n  }\n}'


def _event(kind: str, attempt: int | None = None, message: str = BLOB, step: str = "wake"):
    data = {"attempt": attempt, "message": message} if attempt else {}
    return SimpleNamespace(
        kind=kind,
        operation_id="op-1",
        step=step,
        data=data,
        domain=SimpleNamespace(slug="west"),
        duration_ms=None,
        created_at=datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC),
    )


def test_repeated_retries_print_once_and_then_their_count():
    """A failing wake printed a four-line JSON blob 1.6 times a second."""
    fold = RetryFold()
    printed = [fold.line(_event("operation.step.retry", n)) for n in range(1, 41)]
    printed.append(fold.line(_event("operation.step.retry", 41, message="wake: refused")))
    printed.append(fold.line(_event("domain.failed", step="")))
    lines = "\n".join(p for p in printed if p is not None).splitlines()
    assert lines == [
        '12:00:00.000 operation.step.retry west wake: wake: { "error": { "code": "wake_failed" } }',
        "             ... the same retry 39 more time(s), to attempt 40",
        "12:00:00.000 operation.step.retry west wake: wake: refused",
        "12:00:00.000 domain.failed west",
    ]
