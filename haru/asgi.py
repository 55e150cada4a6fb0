"""ASGI entry point: Django for HTTP, Channels for the dashboard's WebSocket."""

import gc
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "haru.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from fleets.live.urls import websocket_urlpatterns  # noqa: E402
from fleets.proxy.asgi import with_proxy  # noqa: E402

application = ProtocolTypeRouter(
    {
        # The chat proxy's paths skip Django's middleware stack and body buffering: that costs
        # more than the proxy's whole latency budget (bench/proxy.py --compare-django).
        "http": with_proxy(django_asgi),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)

# Everything built so far (Django, the app registry, URL patterns) lives as long as the process:
# move it out of the garbage collector's scans, so collections on the chat path stay short
# (measured by bench/proxy.py: higher throughput and a lower p99 at concurrency 32).
gc.freeze()
