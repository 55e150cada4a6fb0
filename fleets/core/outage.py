"""One failover, one figure: from the first moment a client could not be served to the routing
commit that served them again.

The outage's start is recorded once, when the promotion that answers it is requested: the
moment after the last evidence that the active could serve (its last good heartbeat, its model
servers last seen serving), or an earlier failed data-path request
(fleets.core.model_health.outage_started_at), kept as the operation's `detected_at`. Its end is
the routing commit, kept as the operation's `served_at` by the compare-and-swap that moves the
pointer. Every place that shows a failover's time (the `switch_route` event's `failoverMs`,
`haru_failover_duration_seconds`, the recovery sample's total and `haru_recovery_seconds`, the
fleet page's bar, the overview, Grafana) reads this figure.

Its parts: detection (outage start to the promotion's start) and the steps up to the switch.
The steps after the switch (the best-effort sleep and training restart of the old active) come
after clients were served again and are never part of it.

Pure: the caller passes the operation's timestamps.
"""

from __future__ import annotations

from datetime import datetime

from fleets.core.states import DomainState, OperationKind


def during_outage(*, kind: str, detected_at: datetime | None, source_state: str | None) -> bool:
    """Whether an operation runs while the fleet is down: a promotion away from a failed active.

    An automatic failover carries when its outage began (`detected_at`); an operator's promotion
    counts once the active it moves away from is failed. Whatever such a promotion waits for
    (a trainer's final save above all) is time every client waits too.
    """
    return kind == OperationKind.PROMOTE and (
        detected_at is not None or source_state == DomainState.FAILED
    )


def outage_start(
    *, detected_at: datetime | None, source_seen_at: datetime | None
) -> datetime | None:
    """When the outage began, as recorded on the operation; None when it was not recorded.

    `detected_at` is the recorded start. `source_seen_at` (the old active's last good heartbeat,
    kept when the promotion was requested) stands in only for an operator's promotion requested
    before its `detected_at` was kept: a heartbeat's absence alone is no outage (a supervisor
    can die while its model servers serve on), so it never overrides a recorded start.
    """
    return detected_at if detected_at is not None else source_seen_at


def span_ms(start: datetime | None, end: datetime | None) -> int | None:
    """Milliseconds from `start` to `end` (never negative); None when either is unknown."""
    if start is None or end is None:
        return None
    return max(0, int((end - start).total_seconds() * 1000))


def failover_ms(
    *,
    kind: str,
    source_state: str | None,
    detected_at: datetime | None,
    source_seen_at: datetime | None,
    served_at: datetime | None,
) -> int | None:
    """The failover figure: outage start to routing commit, in ms. None for an operation that
    did not run during an outage (a planned promotion, a drill: no client went unserved), or
    whose start or commit is not known."""
    if not during_outage(kind=kind, detected_at=detected_at, source_state=source_state):
        return None
    return span_ms(outage_start(detected_at=detected_at, source_seen_at=source_seen_at), served_at)
