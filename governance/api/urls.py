from django.urls import path
from rest_framework.routers import DefaultRouter

from . import audit_views, views

router = DefaultRouter()
router.register("datasets", views.DatasetViewSet, basename="dataset")
router.register("grants", views.GrantViewSet, basename="grant")
router.register("ledger", views.LedgerViewSet, basename="ledger")
router.register("analysts", views.AnalystViewSet, basename="analyst")
router.register("requests", views.RequestViewSet, basename="request")
router.register("audit", audit_views.AuditViewSet, basename="audit")

urlpatterns = [
    path("me/", views.me, name="me"),
    path("compose/", views.compose, name="compose"),
    path("engines/", views.engines_list, name="engines"),
    *router.urls,
]
