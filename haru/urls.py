import sys
from pathlib import Path

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import JsonResponse
from django.urls import include, path

from fleets.metrics.registry import metrics_view


def createsuperuser_command() -> str:
    """The command that creates a login on this installation, for the login page.

    From a checkout: the interpreter the server runs on, relative to the checkout (a bare
    `python` outside the venv lacks Django). Installed from the wheel: manage.py is not there,
    so Django's own entry point with Haru's settings. Never an absolute path: the login page is
    public, and the file-system layout is nobody's business.
    """
    base = Path(settings.BASE_DIR)
    if (base / "manage.py").exists():
        try:
            python = str(Path(sys.executable).relative_to(base))
        except ValueError:
            python = "python"
        return f"{python} manage.py createsuperuser"
    return "DJANGO_SETTINGS_MODULE=haru.settings python -m django createsuperuser"


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
    path(
        "login/",
        auth_views.LoginView.as_view(
            redirect_authenticated_user=True,
            extra_context={"createsuperuser": createsuperuser_command()},
        ),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(next_page="login"), name="logout"),
    path("", include("fleets.dashboard.urls")),
]

handler404 = "fleets.api.errors.json_not_found"
handler500 = "fleets.api.errors.json_server_error"
