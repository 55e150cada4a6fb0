"""Whether a planned promotion moves the old active's long streams instead of waiting for them.

The old active's sleep normally drains: requests running there finish first, so a promotion
lasts as long as the longest answer in flight. With a drain bound (the supervisor's
`?drainMs=`, feature `drain-bound`) the sleep aborts what still runs after the bound; the
engines end those streams with `finish_reason: "abort"`, which the proxy takes as a cut and
continues on the new active from the token ids it kept. That is safe only when every stream
on the old active can be continued where routing now points, so each condition below must hold;
otherwise the drain stays whole.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# One rule for which engines can continue a stream, and how a profile names its engine: the
# proxy's (fleets/core/continuation.py), so the promotion never aborts a stream it cannot pick up.
from fleets.core.continuation import engine_continues, engine_of

__all__ = ["DrainBound", "drain_bound", "engine_of"]


@dataclass(frozen=True)
class DrainBound:
    """The decision: `ms` to send as the drain bound (None: drain in full), and why."""

    ms: int | None
    reason: str


def drain_bound(
    *,
    after_ms: int | None,
    routed_to_target: bool,
    source_engines: Iterable[str | None],
    target_engines: Iterable[str | None],
    source_takes_bound: bool,
) -> DrainBound:
    """Decide the drain bound a planned promotion gives the old active's sleep.

    `after_ms`: the policy's streamMigrationAfterMs (None: migration off; 0: at once).
    `routed_to_target`: routing already committed to the probed new active, so a stream the
    sleep aborts is continued there (never sleep the old active before that).
    `source_engines`, `target_engines`: the engines of the bindings on each side (every stream
    must be continuable where it was and where it goes). `source_takes_bound`: the old active's
    supervisor lists `drain-bound` (an older one would ignore the bound and drain in full,
    which is safe, but the step then says what really happens).
    """
    if after_ms is None:
        return DrainBound(None, "stream migration is off (streamMigrationAfterMs null)")
    if not routed_to_target:
        return DrainBound(None, "routing does not point at the new active")
    for side, engines in (("old active", source_engines), ("new active", target_engines)):
        cannot = sorted({e or "unknown" for e in engines if not engine_continues(e)})
        if cannot:
            return DrainBound(
                None, f"the {side} runs engines that cannot continue a stream: {', '.join(cannot)}"
            )
    if not source_takes_bound:
        return DrainBound(None, "the old active's supervisor does not take a drain bound")
    if after_ms == 0:
        return DrainBound(0, "streams still running move to the new active at once")
    return DrainBound(after_ms, f"streams still running after {after_ms} ms move to the new active")
