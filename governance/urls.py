from django.contrib import admin
from django.http import HttpResponse
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from . import analyst_views

def no_favicon(request):
    return HttpResponse(status=204)


urlpatterns = [
    path("favicon.ico", no_favicon),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("api/", include("governance.api.urls")),
    path("analyst/", analyst_views.home, name="analyst-home"),
    path("analyst/login/", analyst_views.token_login, name="analyst-login"),
    path("analyst/logout/", analyst_views.token_logout, name="analyst-logout"),
]

handler404 = "governance.api.errors.page_not_found"
