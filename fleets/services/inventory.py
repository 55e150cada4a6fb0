"""Adding domains and slots: each new row starts in the state the core's rules give it.

The layout service and the admin both add rows here, so neither seeds a state of its own.
"""

from __future__ import annotations

from datetime import datetime

from fleets.base import clock
from fleets.core.states import initial_domain_state, initial_slot_state
from fleets.models import Domain, Fleet, Slot


def domain_add(*, domain: Domain, now: datetime | None = None) -> Domain:
    """Insert `domain` (not yet saved) in its initial state; return it."""
    domain.state = initial_domain_state(domain.provider)
    domain.state_updated_at = now or clock.now()
    domain.save(force_insert=True)
    return domain


def slot_add(*, slot: Slot, on_active: bool | None = None, now: datetime | None = None) -> Slot:
    """Insert `slot` (not yet saved) in its initial state; return it.

    `on_active` says whether the slot's domain is (or, for a fleet being created, will be) the
    active one; None reads it from the fleet's routing pointer.
    """
    if on_active is None:
        active_id = (
            Fleet.objects.filter(domains__pk=slot.domain_id)
            .values_list("active_domain_id", flat=True)
            .first()
        )
        on_active = active_id is not None and active_id == slot.domain_id
    slot.state = initial_slot_state(slot.kind, on_active=on_active)
    slot.state_updated_at = now or clock.now()
    slot.save(force_insert=True)
    return slot
