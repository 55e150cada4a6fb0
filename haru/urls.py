from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import JsonResponse
from django.urls import include, path

from fleets.metrics import metrics_view


def healthz(request):
    """Answer liveness without touching the database, so an outage never fails it."""
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    # The chat proxy (/v1/chat/completions, /v1/completions, /v1/models) is not here: only the
    # lean ASGI app in haru/asgi.py serves it, ahead of Django.
    path("v1/", include("fleets.api.urls")),
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="login"), name="logout"),
    path("", include("fleets.dashboard.urls")),
]

handler404 = "fleets.api.errors.json_not_found"
handler500 = "fleets.api.errors.json_server_error"
