import os

from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class GovernanceAdminConfig(admin_apps.AdminConfig):
    """The admin, with the privacy officer's dashboard as its index (governance.web.admin_site)."""

    default = False
    default_site = "governance.web.admin_site.GovernanceAdminSite"


class GovernanceConfig(AppConfig):
    default = True
    name = "governance"
    verbose_name = "Privacy governance"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from .core import checks  # noqa: F401  (registers the system checks)
        from .web import admin  # noqa: F401  (registers the models with the admin; Django looks for governance.admin)

        from django.conf import settings

        settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
        settings.STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise serves from here (collectstatic)
        if settings.CELERY_BROKER_URL.startswith("filesystem://"):
            for key in ("data_folder_in", "processed_folder", "control_folder"):
                os.makedirs(settings.CELERY_BROKER_TRANSPORT_OPTIONS[key], exist_ok=True)
