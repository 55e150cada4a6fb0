"""A fleet's weighted split of one model's traffic between its stable and a candidate arm.

A rollout (and, later, an adapter version beside the current one) sends a share of a model's
requests to a candidate: the same served name on another domain (a new version on the
standby) while the routing pointer keeps naming the stable active. The splits live beside the
pointer on the fleet row (`Fleet.route_splits`), are moved only with the route revision
(`fleets.services.route_splits`), and every pointer move clears them: a promotion makes one
domain serve everything.

Stored shape, per served model name:

    {"rollout": "<uuid>", "candidateDomain": "<uuid>", "weightPermille": 0..1000,
     "stickyHeader": "" | "<header name>"}

A request is assigned by a hash of its stickiness key (the caller's API key, or the header the
split names), so one user sees one version for as long as the weight does not move past them;
without a key, at random. The hash is salted with the rollout id: another rollout reshuffles.
"""

from __future__ import annotations

import hashlib
import random
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PERMILLE = 1000
# A header name as RFC 9110 allows it (a token), lower case as the proxy sees it, bounded.
# `\Z`, not `$`: `$` also matches before a trailing newline, which no header name holds.
_HEADER = re.compile(r"^[!#$%&'*+.^_`|~0-9a-z-]{1,64}\Z")
_KEYS = {"rollout", "candidateDomain", "weightPermille", "stickyHeader"}
# A fleet serves few models; a split per model, so this bounds what one row may hold.
MAX_SPLITS = 64


class SplitInvalid(ValueError):
    """A stored or requested split the router refuses (the message names the field)."""


@dataclass(frozen=True)
class Split:
    """One model's split: its share (per mille) to the candidate domain, and how to stick."""

    rollout_id: str
    candidate_domain_id: str
    weight_permille: int
    sticky_header: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "rollout": self.rollout_id,
            "candidateDomain": self.candidate_domain_id,
            "weightPermille": self.weight_permille,
            "stickyHeader": self.sticky_header,
        }


def _uuid_text(value: Any, field: str) -> str:
    try:
        return str(uuid.UUID(str(value)))
    except (TypeError, ValueError, AttributeError):
        raise SplitInvalid(f"{field} must be a UUID") from None


def split_parse(raw: Any, *, model: str = "") -> Split:
    """Read one stored split; raise SplitInvalid naming the field at fault."""
    where = f"split of {model!r}: " if model else ""
    if not isinstance(raw, Mapping):
        raise SplitInvalid(f"{where}must be an object")
    unknown = set(raw) - _KEYS
    if unknown:
        raise SplitInvalid(f"{where}unknown keys {sorted(unknown)}")
    weight = raw.get("weightPermille")
    if isinstance(weight, bool) or not isinstance(weight, int) or not 0 <= weight <= PERMILLE:
        raise SplitInvalid(f"{where}weightPermille must be an integer from 0 to {PERMILLE}")
    header = raw.get("stickyHeader", "")
    if not isinstance(header, str) or (header and not _HEADER.match(header)):
        raise SplitInvalid(f"{where}stickyHeader must be a lower-case header name or empty")
    return Split(
        rollout_id=_uuid_text(raw.get("rollout"), f"{where}rollout"),
        candidate_domain_id=_uuid_text(raw.get("candidateDomain"), f"{where}candidateDomain"),
        weight_permille=weight,
        sticky_header=header,
    )


def splits_parse(raw: Any) -> dict[str, Split]:
    """Read a fleet's `route_splits`; raise SplitInvalid on anything the router must refuse."""
    if raw in (None, {}):
        return {}
    if not isinstance(raw, Mapping):
        raise SplitInvalid("route splits must be an object")
    if len(raw) > MAX_SPLITS:
        raise SplitInvalid(f"at most {MAX_SPLITS} route splits")
    return {str(model): split_parse(value, model=str(model)) for model, value in raw.items()}


def splits_dump(splits: Mapping[str, Split]) -> dict[str, dict[str, Any]]:
    return {model: split.as_json() for model, split in sorted(splits.items())}


def bucket(rollout_id: str, key: str) -> int:
    """The stickiness bucket (0..999) of `key` in this rollout: stable across processes."""
    digest = hashlib.blake2b(key.encode(), digest_size=8, key=rollout_id.encode()[:64]).digest()
    return int.from_bytes(digest, "big") % PERMILLE


def to_candidate(split: Split, key: str | None, rng: random.Random | None = None) -> bool:
    """Whether a request with stickiness `key` (None: none) goes to the split's candidate."""
    if split.weight_permille <= 0:
        return False
    if split.weight_permille >= PERMILLE:
        return True
    draw = bucket(split.rollout_id, key) if key else (rng or random).randrange(PERMILLE)
    return draw < split.weight_permille
