"""The one Celery app, configured from Django settings (``CELERY_*``; see settings.py)."""

import logging
import os

from celery import Celery
from celery.signals import beat_init

from .broker import register

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "governance.settings")

log = logging.getLogger(__name__)

register()  # filesystem:// (the embedded default broker): workers.broker's atomic transport
app = Celery("governance", include=["workers.tasks"])
app.config_from_object("django.conf:settings", namespace="CELERY")


@beat_init.connect
def _say_ready(sender=None, **_kwargs):
    """Beat logs "beat: Starting..." before it opens its schedule file and builds the
    schedule; a SIGTERM in between makes Celery build a second scheduler in its signal
    handler and exit 1. This line says the schedule is up (and what it holds): a supervisor
    or a test that stops beat waits for it."""
    scheduler = getattr(sender, "scheduler", None)
    names = sorted(getattr(scheduler, "schedule", {}) or {})
    log.info("beat: ready, %d entries in the schedule: %s", len(names), ", ".join(names))
