"""The adapter registry's rules: the states of a version and of its copies on each domain.

A trainer's completed checkpoint (common/adapter_manifest) becomes an adapter version once the
control plane registers it (`fleets.services.adapters`): a version number per fleet and adapter
name, counted up and never reused, and an immutable record of its digest, size, files, training
facts and the evaluation answers the trainer recorded. Each domain that may serve it holds a
copy, moved through these states by the reconciler (fleets/reconciler/adapters.py):

    absent -> transferring -> stored -> loaded -> probed
                  |             |         |
                  +-> failed <--+---------+      (a digest mismatch, a refused load, a probe
                                                  that answered wrong: the copy's `why`)
    stored | loaded | probed -> removed          (retention, or unloaded and deleted)

`probed` is the only state the proxy may route to: a load the engine reported as done proves
nothing until the adapter answered its golden prompts (the first time, the trainer's recorded
answers; after that, its own baseline).

Pure: no ORM, no clock of its own.
"""

from __future__ import annotations

from enum import StrEnum


class AdapterVersionState(StrEnum):
    # Registered from a trainer's manifest; its copies move on their own.
    REGISTERED = "registered"
    # Refused at registration: a base model the fleet does not serve, an adapter that answers
    # exactly like its base (nothing could prove it is applied), a manifest another store
    # reported with other files under the same digest.
    REJECTED = "rejected"
    # Retention removed its files everywhere; the row stays so its number is never reused.
    RETIRED = "retired"


class CopyState(StrEnum):
    ABSENT = "absent"
    TRANSFERRING = "transferring"
    STORED = "stored"
    LOADED = "loaded"
    PROBED = "probed"
    FAILED = "failed"
    REMOVED = "removed"


# A copy the engine holds (a load was acknowledged); only PROBED is routable.
LOADED_STATES = frozenset({CopyState.LOADED, CopyState.PROBED})
# A copy whose files are complete and checked in the domain's store.
STORED_STATES = frozenset({CopyState.STORED, CopyState.LOADED, CopyState.PROBED})
