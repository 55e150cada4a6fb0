from django.urls import path

from fleets.api import views

urlpatterns = [
    path("fleets", views.FleetListView.as_view(), name="fleet-list"),
    path("fleets/<str:ref>", views.FleetDetailView.as_view(), name="fleet-detail"),
    path("fleets/<str:ref>/route-intent", views.RouteIntentView.as_view(), name="route-intent"),
    path("fleets/<str:ref>/promote", views.PromoteView.as_view(), name="fleet-promote"),
    path("fleets/<str:ref>/demote", views.DemoteView.as_view(), name="fleet-demote"),
    path("fleets/<str:ref>/recovery", views.RecoveryView.as_view(), name="fleet-recovery"),
    path("fleets/<str:ref>/drill", views.DrillView.as_view(), name="fleet-drill"),
    path("fleets/<str:ref>/baselines", views.BaselinesView.as_view(), name="fleet-baselines"),
    path("fleets/<str:ref>/reconcile", views.ReconcileView.as_view(), name="fleet-reconcile"),
    path(
        "fleets/<str:ref>/domains/<str:domain>/provision",
        views.DomainProvisionView.as_view(),
        name="domain-provision",
    ),
    path(
        "fleets/<str:ref>/domains/<str:domain>/stop",
        views.DomainStopView.as_view(),
        name="domain-stop",
    ),
    path(
        "fleets/<str:ref>/operations", views.FleetOperationsView.as_view(), name="fleet-operations"
    ),
    path(
        "fleets/<str:ref>/operations/<str:operation_id>/cancel",
        views.OperationCancelView.as_view(),
        name="operation-cancel",
    ),
    path(
        "operations/<str:operation_id>",
        views.OperationDetailView.as_view(),
        name="operation-detail",
    ),
    path("openapi.json", views.SchemaView.as_view(), name="openapi-schema"),
    path("docs", views.DocsView.as_view(url_name="openapi-schema"), name="api-docs"),
]
