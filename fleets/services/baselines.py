"""Golden baselines: read them for a probe's judgement, record them, each write an event."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Q

from fleets.base import clock
from fleets.core.golden import BaselineReason, GoldenKey, Recorded, answer_sha256
from fleets.models import Fleet, GoldenBaseline, Id
from fleets.services.events import event_record


@dataclass(frozen=True)
class NewBaseline:
    key: GoldenKey
    answer: str


def baselines_for(fleet_id: Id, keys: Iterable[GoldenKey]) -> dict[GoldenKey, Recorded]:
    """Return the recorded baselines of `keys` (absent keys have none)."""
    wanted = set(keys)
    if not wanted:
        return {}
    rows = GoldenBaseline.objects.filter(
        fleet_id=fleet_id, model_name__in={k.model for k in wanted}
    ).values_list(
        "model_name",
        "adapter",
        "profile_fingerprint",
        "engine_version",
        "request_fingerprint",
        "answer_sha256",
        "answer",
    )
    out: dict[GoldenKey, Recorded] = {}
    for model, adapter, profile, engine, request, sha, answer in rows:
        key = GoldenKey(model, adapter, profile, engine, request)
        if key in wanted:
            out[key] = Recorded(sha, answer)
    return out


def baseline_record(
    *,
    fleet_id: Id,
    domain_id: Id | None,
    baselines: Iterable[NewBaseline],
    reason: BaselineReason,
    actor: str,
    operation_id: Id | None = None,
    replace: bool,
) -> list[str]:
    """Record baselines; return the labels of those written (one event each).

    `replace` False keeps an existing baseline (a first serving never overwrites one another
    process recorded meanwhile); True replaces it, and the event names what it replaced, so an
    accepted drift is on the record.
    """
    written: list[str] = []
    now = clock.now()
    with transaction.atomic():
        for new in baselines:
            key = new.key
            lookup = {
                "fleet_id": fleet_id,
                "model_name": key.model,
                "adapter": key.adapter,
                "profile_fingerprint": key.profile_fingerprint,
                "engine_version": key.engine_version,
                "request_fingerprint": key.request_fingerprint,
            }
            values = {
                "answer_sha256": answer_sha256(new.answer),
                "answer": new.answer,
                "domain_id": domain_id,
                "reason": reason,
                "recorded_by": actor,
                "recorded_at": now,
            }
            previous = GoldenBaseline.objects.select_for_update().filter(**lookup).first()
            if previous is not None and not replace:
                continue
            if previous is not None and previous.answer_sha256 == values["answer_sha256"]:
                continue  # the same answer again: nothing changed, nothing to record
            if previous is None:
                try:
                    with transaction.atomic():  # a savepoint: the loser keeps its transaction
                        GoldenBaseline.objects.create(**lookup, **values)
                except IntegrityError:
                    # Another tick recorded this key first: a first serving never overwrites
                    # it, and an operator's re-record can simply be asked again.
                    continue
            else:
                GoldenBaseline.objects.filter(pk=previous.pk).update(**values)
            written.append(key.label)
            event_record(
                fleet_id=fleet_id,
                kind="golden.baseline.recorded",
                actor=actor,
                domain_id=domain_id,
                operation_id=operation_id,
                data={
                    "model": key.model,
                    "adapter": key.adapter or None,
                    "engineVersion": key.engine_version or None,
                    "profileFingerprint": key.profile_fingerprint,
                    "reason": reason,
                    "answerSha256": values["answer_sha256"],
                    "replacedSha256": previous.answer_sha256 if previous else None,
                },
            )
    return written


def baseline_probe_claim(*, fleet_id: Id, now: datetime, interval_ms: int) -> bool:
    """Take the fleet's turn to probe its active for missing baselines; False when one was
    taken within `interval_ms` (by any process: a guarded UPDATE, not a local timer)."""
    since = now - timedelta(milliseconds=interval_ms)
    return bool(
        Fleet.objects.filter(pk=fleet_id)
        .filter(Q(baseline_probe_at__isnull=True) | Q(baseline_probe_at__lte=since))
        .update(baseline_probe_at=now)
    )
