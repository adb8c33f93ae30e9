from django.urls import path
from rest_framework.routers import DefaultRouter

from . import access_views, audit_views, dataset_views, ledger_views, request_views

router = DefaultRouter()
# No format suffixes (no client uses them): with them files/model.pt, without its trailing
# slash, was the file "model" in the format "pt", a 404.
router.include_format_suffixes = False
router.register("datasets", dataset_views.DatasetViewSet, basename="dataset")
router.register("grants", access_views.GrantViewSet, basename="grant")
router.register("ledger", ledger_views.LedgerViewSet, basename="ledger")
router.register("analysts", access_views.AnalystViewSet, basename="analyst")
router.register("requests", request_views.RequestViewSet, basename="request")
router.register("audit", audit_views.AuditViewSet, basename="audit")

urlpatterns = [
    path("me/", access_views.me, name="me"),
    path("compose/", ledger_views.compose, name="compose"),
    path("engines/", request_views.engines_list, name="engines"),
    *router.urls,
]
