"""The proxy's stream-continuation series: their names, in one place for the proxy that writes
them and the readers, and how the server reads the count of continued streams on its host.

- `haru_proxy_streams_continued_total{fleet, endpoint}`: streams cut upstream (reset, EOF
  without the final chunk, `finish_reason: "abort"`) and continued on a domain's engine;
- `haru_proxy_stream_continuation_failures_total{fleet, reason}`: cut streams that could not be
  continued and ended as before;
- `haru_proxy_stream_seam_stall_seconds{fleet}`: the added stall, from the last chunk before
  the cut to the first after it.

The names are the families' as prometheus_client declares them (a Counter adds `_total` to its
sample). The proxy defines the metric objects; this module only names them, so importing it
registers nothing. It sits in `fleets/base`, not `fleets/metrics`, because the operation's
public shape (`fleets/reads`, below the metrics layer) reads the count.
"""

from __future__ import annotations

import logging
from pathlib import Path

from django.conf import settings
from prometheus_client.multiprocess import MultiProcessCollector

log = logging.getLogger(__name__)

STREAMS_CONTINUED = "haru_proxy_streams_continued"
STREAMS_CONTINUED_LABELS = ("fleet", "endpoint")
CONTINUATION_FAILURES = "haru_proxy_stream_continuation_failures"
CONTINUATION_FAILURES_LABELS = ("fleet", "reason")
SEAM_STALL = "haru_proxy_stream_seam_stall_seconds"
SEAM_STALL_LABELS = ("fleet",)


def streams_continued_on_this_host(fleet_slug: str, directory: Path | None = None) -> int:
    """Streams the proxies on this host continued for the fleet, all endpoints, since their
    processes started (what /metrics sums, read the same way: the counters' files).

    Counters live in `counter_<pid>.db` only, so just those are read. A proxy on another host
    writes to its own host's directory, which this cannot see (KNOWN_ISSUES.md).
    """
    where = Path(directory or settings.PROMETHEUS_MULTIPROC_DIR)
    files = [str(p) for p in where.glob("counter_*.db")]
    if not files:
        return 0
    total = 0.0
    for family in MultiProcessCollector.merge(files, accumulate=True):
        if family.name != STREAMS_CONTINUED:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels.get("fleet") == fleet_slug:
                total += sample.value
    return int(total)


def streams_continued_mark(fleet_slug: str) -> int | None:
    """`streams_continued_on_this_host`, or None when the files cannot be read: taken on a
    failover's path (the switch), which a metrics problem must never hold up."""
    try:
        return streams_continued_on_this_host(fleet_slug)
    except Exception:  # noqa: BLE001 - a figure for the page, never a reason to fail a switch
        log.warning("could not read the continued-streams counter", exc_info=True)
        return None
