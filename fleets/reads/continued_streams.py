"""How many streams an operation's routing move continued: the proxies' counter, attributed.

The proxy counts the streams it continues per fleet (`haru_proxy_streams_continued_total`,
fleets/base/continuation_series.py), not per operation. A stream is continued only once routing
points at a domain that can take it, so an operation's share is what the count grew by from
its routing move (`streamsContinuedAtSwitch`, read by switch_route just before the CAS) to the
next routing move of the fleet (its own mark), or to now while no later move happened. That
window also holds streams a blip of the same domain cut and the same domain continued, which
no operation caused; rare, and said so where the figure is shown.

Unknown (None) when routing has not moved, when a mark could not be read, when the counters
went back (a proxy process restarted: the counts before it are gone), and for a window the
event retention pruned.
"""

from __future__ import annotations

from typing import Any

from fleets.base.continuation_series import streams_continued_mark
from fleets.core.states import Step
from fleets.models import Event, Operation

SWITCH_MARK = "streamsContinuedAtSwitch"


def _switches(fleet_id: Any, after_id: int | None = None) -> Any:
    rows = Event.objects.filter(
        fleet_id=fleet_id, kind="operation.step.done", step=Step.SWITCH_ROUTE
    )
    return rows if after_id is None else rows.filter(id__gt=after_id)


def _mark(data: Any) -> int | None:
    value = data.get(SWITCH_MARK) if isinstance(data, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def operation_streams_continued(op: Operation) -> int | None:
    """Streams continued from the operation's routing move until the fleet's next one (or
    now), counted by the proxies on this host; None when that cannot be said."""
    if not op.routing_committed:
        return None
    own = _switches(op.fleet_id).filter(operation_id=op.id).values_list("id", "data").first()
    if own is None:
        return None
    event_id, data = own
    start = _mark(data)
    if start is None:
        return None
    later = _switches(op.fleet_id, event_id).order_by("id").values_list("data", flat=True).first()
    end = _mark(later) if later is not None else streams_continued_mark(op.fleet.slug)
    if end is None or end < start:
        return None
    return end - start
