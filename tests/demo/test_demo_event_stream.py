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


def test_an_adapter_event_names_its_version_and_why():
    """The train-then-serve loop reads as one story: which version, and why it moved."""
    copy = SimpleNamespace(
        kind="adapter.copy.failed",
        operation_id=None,
        step="",
        data={"adapter": "support-bot", "version": 3, "copy": 6, "why": "probe: no answer"},
        domain=None,
        duration_ms=None,
        created_at=datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC),
    )
    rolled = SimpleNamespace(
        **{**vars(copy), "kind": "rollout.rolled_back", "data": {"why": "gate failed"}}
    )
    assert RetryFold().line(copy) == (
        "12:00:00.000 adapter.copy.failed support-bot@v3: probe: no answer"
    )
    assert RetryFold().line(rolled) == "12:00:00.000 rollout.rolled_back: gate failed"


def test_a_route_write_names_the_version_and_the_canarys_share():
    def route(data):
        return SimpleNamespace(
            kind="fleet.adapter.route",
            operation_id=None,
            step="",
            data=data,
            domain=None,
            duration_ms=None,
            created_at=datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC),
        )

    step = {"version": 1, "candidate": 2, "weightPermille": 200, "rollout": "r"}
    canary = route({"adapter": "support-bot", "route": step, "reason": "step 0: 20 %"})
    back = route({"adapter": "support-bot", "route": {"version": 1}, "reason": "gate failed"})
    assert RetryFold().line(canary) == (
        "12:00:00.000 fleet.adapter.route support-bot -> v1 (v2 at 20 %): step 0: 20 %"
    )
    assert RetryFold().line(back) == (
        "12:00:00.000 fleet.adapter.route support-bot -> v1: gate failed"
    )
