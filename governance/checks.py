"""System checks with stable ids: misconfiguration is caught at start-up, not at 3 a.m."""

import math

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register


@register(Tags.security, deploy=True)
def check_secret_key(app_configs, **kwargs):
    problems = []
    if settings.SECRET_KEY == settings.DEV_SECRET_KEY:
        problems.append(Error(
            "SECRET_KEY is the development default.",
            hint="Set SECRET_KEY or SECRET_KEY_FILE.", id="governance.E001"))
    if settings.DEBUG:
        problems.append(Error("DEBUG is on.", hint="Set DEBUG=false in production.", id="governance.E002"))
    return problems


@register()
def check_configuration(app_configs, **kwargs):
    problems = []
    if not settings.DEBUG and settings.SECRET_KEY == settings.DEV_SECRET_KEY:
        problems.append(Error(
            "DEBUG is off but SECRET_KEY is the development default.",
            hint="Set SECRET_KEY or SECRET_KEY_FILE.", id="governance.E003"))
    if not settings.DEBUG and not settings.ALLOWED_HOSTS:
        problems.append(Error("ALLOWED_HOSTS is empty with DEBUG off.", id="governance.E004"))
    engine = settings.DATABASES["default"]["ENGINE"]
    if engine not in ("django.db.backends.sqlite3", "django.db.backends.postgresql"):
        problems.append(Error(
            f"Database engine {engine} is not supported.",
            hint="Use PostgreSQL (DATABASE_URL=postgres://...) or the embedded SQLite default.",
            id="governance.E005"))
    if not settings.DEBUG and engine == "django.db.backends.sqlite3":
        problems.append(Warning(
            "SQLite in production serialises every admission; use PostgreSQL for many analysts.",
            id="governance.W001"))
    if settings.MAX_UPLOAD_BYTES <= 0 or not math.isfinite(settings.MAX_UPLOAD_BYTES):
        problems.append(Error("MAX_UPLOAD_BYTES must be positive.", id="governance.E006"))
    return problems
