from django.urls import path

from fleets.api import views

# (route, view, name): every endpoint under /v1/.
_ENDPOINTS = (
    ("fleets", views.FleetListView, "fleet-list"),
    ("fleets/<str:ref>", views.FleetDetailView, "fleet-detail"),
    ("fleets/<str:ref>/route-intent", views.RouteIntentView, "route-intent"),
    ("fleets/<str:ref>/promote", views.PromoteView, "fleet-promote"),
    ("fleets/<str:ref>/demote", views.DemoteView, "fleet-demote"),
    ("fleets/<str:ref>/recovery", views.RecoveryView, "fleet-recovery"),
    ("fleets/<str:ref>/drill", views.DrillView, "fleet-drill"),
    ("fleets/<str:ref>/baselines", views.BaselinesView, "fleet-baselines"),
    ("fleets/<str:ref>/reconcile", views.ReconcileView, "fleet-reconcile"),
    (
        "fleets/<str:ref>/domains/<str:domain>/provision",
        views.DomainProvisionView,
        "domain-provision",
    ),
    ("fleets/<str:ref>/domains/<str:domain>/stop", views.DomainStopView, "domain-stop"),
    ("fleets/<str:ref>/operations", views.FleetOperationsView, "fleet-operations"),
    (
        "fleets/<str:ref>/operations/<str:operation_id>/cancel",
        views.OperationCancelView,
        "operation-cancel",
    ),
    ("operations/<str:operation_id>", views.OperationDetailView, "operation-detail"),
    ("fleets/<str:ref>/rollouts", views.FleetRolloutsView, "fleet-rollouts"),
    ("fleets/<str:ref>/rollouts/<str:rollout_id>", views.RolloutDetailView, "rollout-detail"),
    (
        "fleets/<str:ref>/rollouts/<str:rollout_id>/<str:action>",
        views.RolloutActionView,
        "rollout-action",
    ),
    ("fleets/<str:ref>/adapters", views.FleetAdaptersView, "fleet-adapters"),
    ("fleets/<str:ref>/adapters/<str:name>", views.AdapterDetailView, "adapter-detail"),
    ("fleets/<str:ref>/adapters/<str:name>/pin", views.AdapterPinView, "adapter-pin"),
    ("fleets/<str:ref>/adapters/<str:name>/unpin", views.AdapterUnpinView, "adapter-unpin"),
    ("openapi.json", views.SchemaView, "openapi-schema"),
)

urlpatterns = [
    *(path(route, view.as_view(), name=name) for route, view, name in _ENDPOINTS),
    path("docs", views.DocsView.as_view(url_name="openapi-schema"), name="api-docs"),
]
