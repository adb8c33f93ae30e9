"""The one Celery app, configured from Django settings (``CELERY_*``; see settings.py)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "governance.settings")

app = Celery("governance", include=["workers.tasks"])
app.config_from_object("django.conf:settings", namespace="CELERY")
