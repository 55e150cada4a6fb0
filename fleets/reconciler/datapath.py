"""The data path's report of an unreachable active: a kick to the reconciler, never a DB write.

Placeholder of the proxy's side of the contract: it only asks for the fleet's next tick through
the installed kicker. The reconciler's side (the payload, the targeted heartbeat that confirms
the failure) replaces this module's body; the signature stays.
"""

from __future__ import annotations

import logging
import threading
import time

from fleets.reconciler import kick

log = logging.getLogger(__name__)

# At most one report per (fleet, domain) this often: during an outage every request fails the
# same way, and one kick already brings the reconciler.
REPORT_EVERY_S = 0.2
_MAX_TRACKED = 4096  # (fleet, domain) pairs remembered; bounded, the keys come from the store

_last: dict[tuple[str, str], float] = {}
_lock = threading.Lock()


def report_unreachable(fleet_id: str, domain_id: str, model: str, failed_at: float) -> None:
    """Tell the reconciler that `model` on `domain_id` refused a request at `failed_at`.

    `failed_at` is time.time() of the first failed request. Non-blocking, never raises.
    """
    try:
        now = time.monotonic()
        key = (str(fleet_id), str(domain_id))
        with _lock:
            if now - _last.get(key, -REPORT_EVERY_S) < REPORT_EVERY_S:
                return
            if len(_last) >= _MAX_TRACKED:
                _last.clear()
            _last[key] = now
        kick.fleet_kick(key[0])
    except Exception:  # noqa: BLE001 - the data path must never fail because of a report
        log.warning("could not report fleet %s unreachable", fleet_id, exc_info=True)
