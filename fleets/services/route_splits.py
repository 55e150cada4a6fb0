"""Moving a model's weighted split: one compare-and-swap with the route revision.

The split (fleets/core/route_split.py) is routing state like the pointer: it moves only where
the revision is what the caller read, the new revision is announced to every proxy the same
way (`revision_publish`), and an event records it. It never moves while a promotion or drill
may move the pointer (the pointer move clears every split; a split set beside it would name a
candidate that may be the new active).
"""

from __future__ import annotations

import uuid

from django.db.models import Exists, F

from fleets.base import clock
from fleets.core.route_split import Split, SplitInvalid, splits_dump, splits_parse
from fleets.models import Domain, Fleet, Id
from fleets.services.events import guarded_update
from fleets.services.route_pointer import pointer_movers
from fleets.services.route_publish import revision_publish


def route_split_set(
    *,
    fleet_id: Id,
    model: str,
    split: Split | None,
    expected_revision: int,
    actor: str,
    reason: str = "",
) -> int | None:
    """Set (or, with None, remove) `model`'s split; return the new revision, or None if the
    CAS lost (the revision moved, a pointer mover is in flight, or the candidate is the active).

    Raises SplitInvalid, changing nothing, for a candidate outside the fleet.
    """
    fleet = Fleet.objects.filter(pk=fleet_id, route_revision=expected_revision).first()
    if fleet is None:
        return None
    splits = splits_parse(fleet.route_splits)
    guard = Fleet.objects.filter(pk=fleet_id, route_revision=expected_revision).filter(
        ~Exists(pointer_movers(fleet_id))
    )
    if split is None:
        if model not in splits:
            return expected_revision
        del splits[model]
    else:
        if not Domain.objects.filter(pk=split.candidate_domain_id, fleet_id=fleet_id).exists():
            raise SplitInvalid("the candidate domain is not in this fleet")
        guard = guard.exclude(active_domain_id=uuid.UUID(split.candidate_domain_id))
        splits[model] = split
    revision = expected_revision + 1
    moved = guarded_update(
        guard,
        {
            "route_splits": splits_dump(splits),
            "route_revision": F("route_revision") + 1,
            "updated_at": clock.now(),
        },
        {
            "fleet_id": fleet_id,
            "kind": "fleet.route.split",
            "actor": actor,
            "data": {
                "model": model,
                "split": split.as_json() if split else None,
                "revision": revision,
                "reason": reason,
            },
        },
        then=lambda: revision_publish(str(fleet_id), revision),
    )
    return revision if moved else None
