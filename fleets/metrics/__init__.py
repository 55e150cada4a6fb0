"""Every Prometheus series Haru exports, and the `/metrics` view (`registry`).

`register()`, called once at start-up (`FleetsConfig.ready`), is the one place that hooks them up:
the scrape-time database collectors and the proxy's flush before each scrape. The per-process
counters and histograms (`reconcile`, `requests`, the placement refusals) are prometheus_client
objects that join its default registry when their module defines them.
"""


def database_collectors() -> list:
    """One of each scrape-time collector that reads the database (each through
    `scrape.read_store`, so that a scrape with the store down answers at once)."""
    # Imported here: the collectors read models, so they wait for the app registry.
    from fleets.metrics import (  # noqa: PLC0415
        adapters,
        failover_guard,
        history,
        placement,
        readiness,
        reconcile,
        rollouts,
    )

    return [
        history.HistoryCollector(),
        readiness.ReadinessCollector(),
        failover_guard.FailoverGuardCollector(),
        reconcile.StateCollector(),
        placement.GpuPlanCollector(),
        rollouts.RolloutCollector(),
        adapters.AdapterFreshnessCollector(),
    ]


def register() -> None:
    """Register the database collectors and the before-scrape flush (idempotent)."""
    from fleets.metrics import requests  # noqa: PLC0415 - reads models (above)
    from fleets.metrics.registry import before_scrape, register_database_collector  # noqa: PLC0415

    for collector in database_collectors():
        register_database_collector(collector)
    before_scrape.connect(requests.flush_before_scrape, dispatch_uid="haru-proxy-metrics-flush")
