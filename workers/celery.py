"""The one Celery app, configured from Django settings (``CELERY_*``; see settings.py)."""

import os

from celery import Celery

from .broker import register

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "governance.settings")

register()  # filesystem:// (the embedded default broker): workers.broker's atomic transport
app = Celery("governance", include=["workers.tasks"])
app.config_from_object("django.conf:settings", namespace="CELERY")
