"""Per-model serving health: whether one model's own server can take requests.

Pure rules. The data path decides on a model's own server, never on its supervisor or its
neighbours on the slot: a supervisor that stops answering is a control-plane fault (the domain
goes degraded, nothing is promoted to it), and a model whose server still answers keeps serving
until routing moves. The reconciler reads what the supervisor says about each model and, when
the supervisor cannot tell (it is down, or it lists the model without knowing its posture),
asks the model server itself (`GET <servingUrl>/health`, bounded).

- `model_health`: what one heartbeat says about one model's server (None: no news, keep it).
- `is_model_servable`: whether the proxy may send a request to a model on the active.
- `serving_recently`: whether any of a domain's model servers was seen serving within a
  window (staleness of the supervisor alone must not fail over such an active).
- `unreachable_verdict`: the data-path confirmation: is a host gone, or only slow?
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from enum import StrEnum

from fleets.core.mirror import ModelPosture
from fleets.core.states import DomainState, InferenceState


class ServerHealth(StrEnum):
    """What is known about one model's own server."""

    UP = "up"  # it answered (or its supervisor read it awake): it takes requests
    DOWN = "down"  # it refused the connection, answered unavailable, or sleeps
    UNKNOWN = "unknown"  # never observed (a fresh binding)


class Reach(StrEnum):
    """How a direct call to a server (a model server or a supervisor) ended."""

    ANSWERED = "answered"  # a healthy answer
    UNAVAILABLE = "unavailable"  # it answered, but says it cannot serve (5xx)
    REFUSED = "refused"  # nothing listens there: the connection was refused
    TIMEOUT = "timeout"  # no answer in time: maybe slow, maybe a partition
    NOT_ASKED = "not_asked"


def model_health(
    *, supervisor_answered: bool, posture: ModelPosture, direct: Reach
) -> ServerHealth | None:
    """Return one model server's health from one heartbeat, or None to keep what is known.

    The supervisor's reading wins when it has one (it reads the engine itself); otherwise the
    direct call decides. A timeout is not news: a partition is judged by the stale window.
    """
    if supervisor_answered and posture == ModelPosture.AWAKE:
        return ServerHealth.UP
    if supervisor_answered and posture == ModelPosture.ASLEEP:
        return ServerHealth.DOWN  # a sleeping engine cannot take requests
    if direct == Reach.ANSWERED:
        return ServerHealth.UP
    if direct in (Reach.REFUSED, Reach.UNAVAILABLE):
        return ServerHealth.DOWN
    return None


def needs_direct_check(*, supervisor_answered: bool, posture: ModelPosture) -> bool:
    """Whether the model server must be asked itself: the supervisor could not say."""
    return not supervisor_answered or posture in (ModelPosture.UNKNOWN, ModelPosture.MISSING)


# A domain whose model may take traffic at all; failed only with the model proven up (an
# escalated active whose supervisor is gone still serves until routing moves: fail open).
_ROUTABLE_DOMAIN_STATES = frozenset({DomainState.READY, DomainState.DEGRADED})
_ROUTABLE_IF_PROVEN_UP = frozenset({DomainState.READY, DomainState.DEGRADED, DomainState.FAILED})


def is_model_servable(domain_state: str, slot_state: str, health: str) -> bool:
    """Tell whether the proxy may send one model's requests to the active.

    Refused only when the model's own server is reported down, or when the control plane put
    the slot somewhere no server runs (asleep, waking, stopped). A slot marked failed because
    its supervisor vanished or a neighbour died still serves while its own server is up.
    """
    if health == ServerHealth.DOWN:
        return False
    if slot_state == InferenceState.SERVING and domain_state in _ROUTABLE_DOMAIN_STATES:
        return True
    return (
        health == ServerHealth.UP
        and slot_state in (InferenceState.SERVING, InferenceState.FAILED)
        and domain_state in _ROUTABLE_IF_PROVEN_UP
    )


def serving_recently(
    seen_serving: Iterable[datetime | None], *, now: datetime, window_ms: int
) -> bool:
    """Whether any model server was seen serving within `window_ms` of `now`."""
    window = timedelta(milliseconds=window_ms)
    return any(at is not None and timedelta(0) <= now - at <= window for at in seen_serving)


class Verdict(StrEnum):
    """What one data-path confirmation round says about a host."""

    GONE = "gone"  # supervisor and every model server refused: nothing listens
    MODELS_DOWN = "models_down"  # the supervisor answers, some model servers do not
    SLOW = "slow"  # something timed out: a partition looks like this; keep the stale window
    FINE = "fine"  # the reported failure is not confirmed


def unreachable_verdict(supervisor: Reach, models: Sequence[Reach]) -> Verdict:
    """Classify one targeted check of a host a proxy could not reach.

    Only refused connections everywhere prove the processes are gone; a timeout anywhere could
    be a partition, which the stale window (not the data path) decides.
    """
    if supervisor == Reach.REFUSED and models and all(m == Reach.REFUSED for m in models):
        return Verdict.GONE
    if supervisor == Reach.TIMEOUT or any(m == Reach.TIMEOUT for m in models):
        return Verdict.SLOW
    if any(m in (Reach.REFUSED, Reach.UNAVAILABLE) for m in models):
        return Verdict.MODELS_DOWN
    return Verdict.FINE


def outage_started_at(
    last_good: Iterable[datetime | None], first_failed_request: datetime | None
) -> datetime | None:
    """The first moment a client could not be served, as well as Haru can tell.

    `last_good`: the last moments the active was seen able to serve (its last good heartbeat,
    its model servers last seen up): the outage began after the latest of them. A failed
    data-path request before that is earlier evidence and wins.
    """
    seen = [at for at in last_good if at is not None]
    start = max(seen) if seen else None
    if first_failed_request is not None and (start is None or first_failed_request < start):
        return first_failed_request
    return start
