from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path

from fleets.metrics import metrics_view


def healthz(request):
    """Answer liveness without touching the database, so an outage never fails it."""
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    path("v1/", include("fleets.api.urls")),
    path("admin/", admin.site.urls),
]

handler404 = "fleets.api.errors.json_not_found"
handler500 = "fleets.api.errors.json_server_error"
