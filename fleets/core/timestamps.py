"""The one spelling of a timestamp in everything Haru writes as JSON: RFC 3339 in UTC, with `Z`.

Pure, so the core's documents (readiness, recovery time, route intent) and `fleets.base.clock.iso`
(every other API body, event and live message) spell time the same way. The fraction is
Python's: none when the microseconds are zero, else all six digits (the database keeps
microseconds, and a body never says less than the row it came from).
"""

from __future__ import annotations

from datetime import UTC, datetime


def utc_iso(moment: datetime) -> str:
    """Format an aware datetime as RFC 3339 in UTC with a `Z` suffix.

    Raise ValueError for a naive one: guessing its zone could mislabel it by hours.
    """
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("a timestamp must be timezone-aware")
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def parse_iso(value: object) -> datetime | None:
    """Read back a timestamp Haru wrote (`Z` or an offset); None for anything else."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
