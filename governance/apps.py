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

        from .core.roles import hold_usernames_to_the_rule

        hold_usernames_to_the_rule()
        settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
        _create_private_sqlite(settings.DATABASES["default"])
        settings.STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise serves from here (collectstatic)
        try:  # upload spools (settings.FILE_UPLOAD_TEMP_DIR): the owner's only, as the copies
            os.makedirs(settings.FILE_UPLOAD_TEMP_DIR, mode=0o700, exist_ok=True)
        except OSError:  # a read-only DATA_DIR (a worker's mount): nothing is uploaded there
            pass
        if settings.CELERY_BROKER_URL.startswith("filesystem://"):
            for key in ("data_folder_in", "processed_folder", "control_folder"):
                os.makedirs(settings.CELERY_BROKER_TRANSPORT_OPTIONS[key], exist_ok=True)


def _create_private_sqlite(db: dict) -> None:
    """Create the embedded default's SQLite file readable by its owner only (0600).

    SQLite would create it under the process's umask (0644 under 022): the ledger, the grants
    and the audit trail readable by every account on the host. Its -wal and -shm files take
    the database file's mode. A file that exists is left as it is (an operator's choice).
    """
    if db.get("ENGINE") != "django.db.backends.sqlite3":
        return
    name = str(db.get("NAME", ""))
    if not name or name == ":memory:" or name.startswith("file:"):
        return
    try:
        os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    except OSError:  # a folder that does not exist or cannot be written: Django reports it on connecting
        pass
