"""`GET /metrics`: Prometheus exposition of the default registry.

Each part registers its own metrics in its own module (the proxy, the reconciler); this view
only renders them. Open like /healthz: scrapers rarely carry tokens, and it holds no secrets.
"""

from __future__ import annotations

from django.http import HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest


def metrics_view(request):
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
