"""The adapter registry: register a trainer's manifest as a version, move its copies.

Every write is a compare-and-swap: a version number is taken inside the insert (the unique
constraints decide a race, and the loser reads what won), a copy moves only where its
`version_token` is still what the caller read. No external call happens here: the reconciler
(fleets/reconciler/adapters.py) talks to the supervisors first, then calls these with what it
saw. The rules (what is kept, what a probe must answer) are fleets.core.adapters'.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Max

from common.adapter_manifest import Manifest, manifest_parse
from fleets.base import clock
from fleets.core.adapters import AdapterVersionState, CopyState
from fleets.core.timestamps import parse_iso
from fleets.models import AdapterCopy, AdapterVersion, Event, Fleet, Id, ModelBinding
from fleets.services.events import EventFields, event_record, guarded_update

log = logging.getLogger(__name__)

# Two registrations of the same name racing for the next number: the loser retries this often.
REGISTER_RETRIES = 5
# What a `why` keeps (a supervisor's message, a probe's verdict): bounded, as every edge.
MAX_WHY_CHARS = 500

COPY_FAILED_EVENT = "adapter.copy.failed"


@dataclass(frozen=True)
class Registration:
    version: AdapterVersion
    created: bool  # False: this digest was registered before (the same version)


def _why(text: str) -> str:
    return text[:MAX_WHY_CHARS]


def _refusal(fleet_id: Id, manifest: Manifest) -> str:
    """Why a parsed manifest is refused, or "" when it may be registered."""
    if not ModelBinding.objects.filter(
        domain__fleet_id=fleet_id, name=manifest.base_model
    ).exists():
        return f"base model {manifest.base_model!r} is not a model this fleet serves"
    if not manifest.distinguishable():
        return (
            "every evaluation answer equals the base model's: nothing could tell the adapter "
            "applied from not applied"
        )
    return ""


def adapter_register(
    *,
    fleet_id: Id,
    manifest: Mapping[str, Any],
    source_domain_id: Id | None,
    checkpoint: str = "",
    actor: str = "reconciler",
) -> Registration:
    """Register a trainer's manifest (as the supervisor listed it) as the next version of its
    name; the same digest again is the same version (idempotent).

    A manifest for a base model the fleet does not serve, or one that cannot be told from its
    base, is recorded as `rejected` with why (its number is taken too: numbers are never
    reused), with an `adapter.rejected` event. A registered one gets a copy on every domain of
    the fleet that binds its base model (`stored` on the source, `absent` elsewhere) and an
    `adapter.registered` event. Raises ManifestInvalid, writing nothing, for a manifest off the
    contract.
    """
    parsed = manifest_parse(manifest)
    digest = parsed.digest
    for _ in range(REGISTER_RETRIES):
        existing = AdapterVersion.objects.filter(
            fleet_id=fleet_id, name=parsed.name, digest=digest
        ).first()
        if existing is not None:
            return Registration(existing, created=False)
        why = _refusal(fleet_id, parsed)
        try:
            return Registration(
                _insert(fleet_id, parsed, why, source_domain_id, checkpoint, actor), True
            )
        except IntegrityError:
            # Another tick took this number, or registered this very digest: read again.
            continue
    raise RuntimeError(f"adapter {parsed.name!r}: no version number after {REGISTER_RETRIES} tries")


def _insert(
    fleet_id: Id,
    parsed: Manifest,
    why: str,
    source_domain_id: Id | None,
    checkpoint: str,
    actor: str,
) -> AdapterVersion:
    now = clock.now()
    state = AdapterVersionState.REJECTED if why else AdapterVersionState.REGISTERED
    with transaction.atomic():
        # Registrations of one fleet queue on its row for the few milliseconds of this insert
        # (they are rare: one per trainer checkpoint): without it, N racing names retry N
        # times. The unique constraints still decide anything this misses.
        list(Fleet.objects.select_for_update().filter(pk=fleet_id).values_list("pk", flat=True))
        top = AdapterVersion.objects.filter(fleet_id=fleet_id, name=parsed.name).aggregate(
            top=Max("version")
        )["top"]
        version = AdapterVersion.objects.create(
            fleet_id=fleet_id,
            name=parsed.name,
            version=(top or 0) + 1,
            base_model=parsed.base_model,
            base_model_digest=parsed.base_model_digest,
            digest=parsed.digest,
            size_bytes=parsed.bytes,
            manifest=parsed.as_json(),
            source_domain_id=source_domain_id,
            checkpoint=checkpoint[:200],
            completed_at=parse_iso(parsed.completed_at) or now,
            registered_at=now,
            state=state.value,
            why=_why(why),
        )
        data = {
            "adapter": parsed.name,
            "version": version.version,
            "digest": parsed.digest,
            "baseModel": parsed.base_model,
            "bytes": parsed.bytes,
        }
        if why:
            event_record(
                fleet_id=fleet_id,
                kind="adapter.rejected",
                actor=actor,
                domain_id=source_domain_id,
                data={**data, "why": version.why},
            )
            return version
        domains = set(
            ModelBinding.objects.filter(
                domain__fleet_id=fleet_id, name=parsed.base_model
            ).values_list("domain_id", flat=True)
        )
        AdapterCopy.objects.bulk_create(
            AdapterCopy(
                adapter=version,
                domain_id=d,
                state=(CopyState.STORED if d == source_domain_id else CopyState.ABSENT).value,
                bytes_stored=parsed.bytes if d == source_domain_id else 0,
                updated_at=now,
            )
            for d in sorted(domains, key=str)
        )
        event_record(
            fleet_id=fleet_id,
            kind="adapter.registered",
            actor=actor,
            domain_id=source_domain_id,
            data={**data, "copies": len(domains)},
        )
    return version


def copy_move(
    *,
    copy: AdapterCopy,
    to_state: CopyState,
    why: str = "",
    actor: str = "reconciler",
    **fields: Any,
) -> bool:
    """Move one copy to `to_state` where its token is still the one read (`copy` as read);
    `fields`: what else the move writes (bytes_stored, baseline, loaded_at, probed_at). Return
    whether it moved; a move to another state leaves an `adapter.copy.<state>` event."""
    now = clock.now()
    values: dict[str, Any] = {
        "state": to_state.value,
        "why": _why(why),
        "version_token": F("version_token") + 1,
        "updated_at": now,
        **fields,
    }
    events: list[EventFields] = []
    if to_state.value != copy.state:
        version = copy.adapter
        events.append(
            {
                "fleet_id": version.fleet_id,
                "kind": f"adapter.copy.{to_state.value}",
                "actor": actor,
                "domain_id": copy.domain_id,
                "data": {
                    "adapter": version.name,
                    "version": version.version,
                    "copy": copy.id,
                    "from": copy.state,
                    **({"why": _why(why)} if why else {}),
                },
            }
        )
    moved = guarded_update(
        AdapterCopy.objects.filter(pk=copy.id, version_token=copy.version_token), values, *events
    )
    if moved:
        copy.state = to_state.value
        copy.why = _why(why)
        copy.version_token += 1
        copy.updated_at = now
        for key, value in fields.items():
            setattr(copy, key, value)
    return bool(moved)


def copies_add(*, version: AdapterVersion, domain_ids: Iterable[Id]) -> list[AdapterCopy]:
    """Give a registered version an `absent` copy on domains that bind its base model but have
    none (a domain added after the registration); one a concurrent pass added is kept.
    Return the copies of those domains as they are now."""
    ids = set(domain_ids)
    AdapterCopy.objects.bulk_create(
        [
            AdapterCopy(adapter=version, domain_id=d, updated_at=clock.now())
            for d in sorted(ids, key=str)
        ],
        ignore_conflicts=True,
    )
    copies = list(AdapterCopy.objects.filter(adapter=version, domain_id__in=ids))
    for c in copies:
        c.adapter = version
    return copies


def copy_attempts(copy: AdapterCopy) -> int:
    """How many times this copy failed (its `adapter.copy.failed` events): read only for a
    copy that is failed, never on an idle tick."""
    return Event.objects.filter(
        fleet_id=copy.adapter.fleet_id, kind=COPY_FAILED_EVENT, data__copy=copy.id
    ).count()


def adapter_retire(*, version: AdapterVersion, actor: str = "reconciler") -> bool:
    """Retire a registered version whose files are gone from every domain: its copies are
    `removed`, the row stays (its number is never reused). Return whether it moved."""
    with transaction.atomic():
        moved = guarded_update(
            AdapterVersion.objects.filter(
                pk=version.id, state=AdapterVersionState.REGISTERED.value
            ),
            {"state": AdapterVersionState.RETIRED.value},
            {
                "fleet_id": version.fleet_id,
                "kind": "adapter.retired",
                "actor": actor,
                "data": {"adapter": version.name, "version": version.version},
            },
        )
        if moved:
            AdapterCopy.objects.filter(adapter_id=version.id).update(
                state=CopyState.REMOVED.value,
                version_token=F("version_token") + 1,
                updated_at=clock.now(),
            )
    return bool(moved)
