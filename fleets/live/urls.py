"""WebSocket routes; `haru/asgi.py` wraps them in session auth and a same-origin check
(`fleets/live/origin.py`)."""

from django.urls import path

from fleets.live import consumers

websocket_urlpatterns = [
    path("ws/fleets/<str:slug>/", consumers.FleetConsumer.as_asgi()),
    path("ws/overview/", consumers.OverviewConsumer.as_asgi()),
]
