"""Which arm of a weighted split takes one request (the routing half of fleets/core/route_split).

A split model's request goes to the candidate arm when `to_candidate` says so for its
stickiness key, and the candidate can take traffic now; otherwise to the stable arm (the
active, `handler.pick`). The key: the value of the split's sticky header when it names one and
the request carries it, else the caller's API key (the bearer token it presents, hashed here
and never kept), else none (each request drawn on its own). So one user sees one version in
every proxy process, for as long as the weight does not move past them.

An arm that cannot take traffic gets none and the other takes its share: a candidate whose
server is down, whose slot is not serving or that the snapshot could not read gets nothing,
and a stable arm that cannot serve hands the whole share to a routable candidate. A request
is refused (or held, fleets/proxy/hold.py) only when neither arm can serve it, exactly as an
unsplit model with no routable server. A split at weight 0 sends the candidate nothing, even
then: a rolled-back or pinned candidate must not take user requests.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from fleets.core.arm_stats import Arm
from fleets.core.route_split import Split, to_candidate

if TYPE_CHECKING:
    from fleets.core.adapter_route import AdapterRoute
    from fleets.proxy.snapshots import Route, SplitRoute

# A sticky header's value is client-chosen: only this much of it keys the hash.
MAX_KEY_CHARS = 256


def sticky_key(split: Split | AdapterRoute, headers: dict[bytes, bytes]) -> str | None:
    """The request's stickiness key for `split` (or an adapter route, which keys its versions
    the same way), or None (a draw per request)."""
    if split.sticky_header:
        value = headers.get(split.sticky_header.encode())
        if value:
            return "h:" + value[:MAX_KEY_CHARS].decode("latin-1")
    authorization = headers.get(b"authorization")
    if authorization:
        scheme, _, credential = authorization.strip().partition(b" ")
        credential = credential.strip()
        if scheme.lower() == b"bearer" and credential:
            # Hashed at once: the key is a digest, and nothing keeps the token.
            return "k:" + hashlib.blake2b(credential, digest_size=16).hexdigest()
    return None


def choose(
    split: SplitRoute,
    stable: Route | None,
    headers: dict[bytes, bytes],
    *,
    avoid_candidate: bool,
) -> tuple[Arm, Route | None]:
    """The arm this request goes to, with the candidate's route when it is the candidate
    (None for the stable arm: the caller picks the active's route as for any model).
    `avoid_candidate`: the candidate already failed this request (it is retried on stable)."""
    candidate = split.candidate
    # Weight 0 is a decision (a gate's rollback, an operator's pin), not an empty share: the
    # candidate then takes nothing, even while the stable arm cannot serve.
    if (
        candidate is not None
        and split.split.weight_permille > 0
        and not avoid_candidate
        and (stable is None or to_candidate(split.split, sticky_key(split.split, headers)))
    ):
        return Arm.CANDIDATE, candidate
    return Arm.STABLE, None
