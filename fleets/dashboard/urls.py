"""Dashboard routes, mounted at the site root by `haru/urls.py`."""

from django.urls import path

from fleets.dashboard import views

app_name = "dashboard"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("live/overview/", views.overview_live, name="overview-live"),
    path("live/heartbeats/", views.heartbeats_live, name="heartbeats-live"),
    path("fleets/<slug:slug>/", views.fleet_detail, name="fleet"),
    path("fleets/<slug:slug>/live/", views.fleet_live, name="fleet-live"),
    path("fleets/<slug:slug>/actions/<str:action>/", views.fleet_action, name="fleet-action"),
]
