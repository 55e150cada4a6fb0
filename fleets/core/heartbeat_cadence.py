"""How often an idle fleet's heartbeats are asked and written: what keeps an idle tick cheap.

An idle fleet (its active ready, nothing in flight) changes nothing from one tick to the next, so
most of what a tick used to write was the same row again. Three rules, each bounded by
`heartbeatStaleMs` so that a host that stops answering still reads as stale in time:

- A good heartbeat that changed nothing (same report, no move) writes no row. Under the fleet's
  tick lease its sighting is kept on the lease's give-back (`fleets.reads.sightings`: every
  freshness reader takes the later of that and the row's `last_seen_at`), so a live host reads
  as seen at the last tick. A tick without a lease (tests, the race suite) records it on the
  row once the stored one is a third of `heartbeatStaleMs` old, as before.
- A healthy standby (ready, answering, with a ready active and nothing in flight) is asked for
  its status every `standbyHeartbeatMs` (capped at the same third), not every tick.
- GPU memory (display data) is read every GPU_MEMORY_EVERY_MS while an operation is in flight,
  otherwise every GPU_MEMORY_IDLE_EVERY_MS; a reading that differs from the stored one is
  written, one that does not is not (its time, `gpusAt`, then stays that of the last reading
  stored: when the memory was last seen as it is).

A failed heartbeat, a move of any row, or a report that differs is written at once, as before.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from fleets.core.beat_plan import BeatPlan
from fleets.core.policy import Policy

# The dashboard's memory bars during an operation need no more than this.
GPU_MEMORY_EVERY_MS = 1000
# With nothing in flight the bars only show what sleeps and trains: once a minute will do (each
# read is a call to the host, its CPU on both sides, and a row write).
GPU_MEMORY_IDLE_EVERY_MS = 60_000


def record_every(policy: Policy) -> timedelta:
    """How old a stored sighting may get before an unchanged heartbeat records it again."""
    return timedelta(milliseconds=policy.heartbeat_stale_ms / 3)


def record_due(last_seen_at: datetime | None, now: datetime, policy: Policy) -> bool:
    """Whether an unchanged good heartbeat must still record its sighting (never recorded, or
    recorded longer ago than `record_every`; a time ahead of `now` is treated as due)."""
    if last_seen_at is None:
        return True
    age = now - last_seen_at
    return not timedelta(0) <= age < record_every(policy)


def standby_every(policy: Policy) -> timedelta:
    """How often a healthy standby is asked for its status (0: every tick)."""
    return min(timedelta(milliseconds=policy.standby_heartbeat_ms), record_every(policy))


def standby_beat_due(
    *,
    last_seen_at: datetime | None,
    healthy: bool,
    now: datetime,
    policy: Policy,
) -> bool:
    """Whether to ask a standby this tick: always unless `healthy` (the caller's judgement: it
    is ready and answering, the active is ready, nothing is in flight) and seen within
    `standby_every`."""
    every = standby_every(policy)
    if not healthy or last_seen_at is None or every <= timedelta(0):
        return True
    age = now - last_seen_at
    return not timedelta(0) <= age < every


# Report keys that say only when something was checked: a report that differs in them alone
# is no news (the heartbeat note; the GPU memory reading's time, its values compared).
_TIMES_ONLY = ("heartbeat", "gpusAt")


def report_changed(stored: Any, seen: dict[str, Any]) -> bool:
    """Whether the report a beat would store differs from the stored one (when the heartbeat
    and the GPU memory were checked aside: a reading of the same memory is no news)."""
    if not isinstance(stored, dict):
        return True

    def news(report: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in report.items() if k not in _TIMES_ONLY}

    return news(stored) != news(seen)


def gpu_read_due(gpus_read_at: datetime | None, now: datetime, *, in_flight: bool) -> bool:
    """Whether to ask for GPU memory now: every GPU_MEMORY_EVERY_MS while an operation is in
    flight, otherwise every GPU_MEMORY_IDLE_EVERY_MS (`gpus_read_at`: the last time asked)."""
    if gpus_read_at is None:
        return True
    every = GPU_MEMORY_EVERY_MS if in_flight else GPU_MEMORY_IDLE_EVERY_MS
    return not timedelta(0) <= now - gpus_read_at < timedelta(milliseconds=every)


def has_moves(plan: BeatPlan) -> bool:
    """Whether a beat's plan moves or records anything besides the sighting itself."""
    return bool(
        plan.slots or plan.pids or plan.domain or plan.health or plan.versions or plan.failed
    )


def sighting_dropped(
    plan: BeatPlan,
    *,
    stored_report: Any,
    failing: bool,
    last_seen_at: datetime | None,
    policy: Policy,
    kept_elsewhere: bool = False,
) -> BeatPlan:
    """The plan without its sighting record when that record would be no news: a good beat
    that moves nothing, on a heartbeat that was not failing, with the same report as stored
    and (unless the sighting is `kept_elsewhere`: on the tick lease's give-back) a stored
    sighting younger than `record_every`."""
    if plan.seen is None or failing or has_moves(plan):
        return plan
    if report_changed(stored_report, plan.seen.to_json()):
        return plan
    if not kept_elsewhere and record_due(last_seen_at, plan.observed_at, policy):
        return plan
    return replace(plan, seen=None, gpus_read_at=None)
