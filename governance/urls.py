from django.contrib import admin
from django.http import HttpResponse, JsonResponse
from django.urls import include, path, register_converter
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from .web import analyst_views, auditor_views


class DatasetName:
    """A path segment that can be a dataset's name (``registry.NAME_RE``): any other, a NUL
    included, is a 404 before a query (PostgreSQL's text refuses a NUL: a 500 there)."""
    regex = r"[a-z0-9][a-z0-9_-]{0,99}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(DatasetName, "dataset")


def no_favicon(request):
    return HttpResponse(status=204)


def healthz(request):
    """Liveness and readiness: the process answers and its database does (no login)."""
    from django.db import connection

    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
    except Exception:  # noqa: BLE001 - any database failure means not ready
        return JsonResponse({"status": "unavailable", "database": "unreachable"}, status=503)
    return JsonResponse({"status": "ok", "database": "ok"})


urlpatterns = [
    path("favicon.ico", no_favicon),
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # Swagger UI from the sidecar's static files; its initializer is a script of its own
    # (/api/docs/?script=), not inline, so that the page runs under the CSP
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema", http_method_names=["get", "head"]),
         name="docs"),
    path("api/", include("governance.api.urls")),
    path("analyst/", analyst_views.home, name="analyst-home"),
    path("analyst/login/", analyst_views.token_login, name="analyst-login"),
    path("analyst/logout/", analyst_views.token_logout, name="analyst-logout"),
    path("analyst/token/", analyst_views.new_token, name="new-token"),
    path("auditor/", auditor_views.home, name="auditor-home"),
    path("auditor/datasets/<dataset:name>/", auditor_views.trail, name="auditor-trail"),
    path("auditor/verify/", auditor_views.verify, name="auditor-verify"),
    path("auditor/export/", auditor_views.export, name="auditor-export"),
]

handler404 = "governance.api.errors.page_not_found"
