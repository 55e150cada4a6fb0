"""ASGI entry point: Django for HTTP, Channels for the dashboard's WebSocket."""

import atexit
import gc
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "haru.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from fleets.live.origin import SameOriginValidator  # noqa: E402
from fleets.live.urls import websocket_urlpatterns  # noqa: E402
from fleets.metrics.registry import mark_this_process_dead  # noqa: E402
from fleets.proxy.asgi import with_proxy  # noqa: E402
from fleets.server.driver import SERVE_WORKER_ENV, start_for_server  # noqa: E402
from fleets.server.hosts import AllowedHostsGuard  # noqa: E402

application = ProtocolTypeRouter(
    {
        # The chat proxy's paths skip Django's middleware stack and body buffering: that costs
        # more than the proxy's whole latency budget (bench/proxy.py --compare-django).
        # The Host check runs first: the proxy's paths never reach Django's own (DNS rebinding).
        "http": AllowedHostsGuard(with_proxy(django_asgi)),
        # Only pages this server served may open a socket (fleets/live/origin.py).
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

# `serve --workers N`: each worker drives the ticks of the operations it accepts (a kick-only
# loop, or Celery with this process as the fallback), so they start at once whichever worker
# took the request; the parent ticks every fleet (fleets/server/driver.py).
if os.environ.get(SERVE_WORKER_ENV):
    _driver = start_for_server(role="worker")
    atexit.register(_driver.stop)

# Each uvicorn worker imports this module: on its exit, prometheus_client's live gauges of this
# process are dropped from the host's metrics directory (its counters stay in the sums).
atexit.register(mark_this_process_dead)

# Everything built so far (Django, the app registry, URL patterns) lives as long as the process:
# move it out of the garbage collector's scans, so collections on the chat path stay short
# (measured by bench/proxy.py: higher throughput and a lower p99 at concurrency 32).
gc.freeze()
