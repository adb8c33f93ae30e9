"""Sending a request's task to the workers, by name through the one Celery app.

Governance never imports ``workers.tasks`` (which imports governance when it runs), and
the tasks never import the recovery sweep to send: both meet here. ``send`` looks the
task up by name in the app's registry (importing the app's ``include`` modules once, as
a worker does), and calls its ``apply_async``: eagerly in-process under
``task_always_eager`` (tests), otherwise a message to the broker.

When the broker refuses the message (Redis down or restarting: Celery's
``OperationalError`` once its publish retries are spent; or kombu's Redis channel torn
down under a publish by another thread's reconnection), the admitted, charged request
must not turn its POST into a 500: it stays ``queued``, marked unsent
(``progress.unsent_at``), and the next recovery sweep sends it (``governance.requests.recovery``,
rule 3). ``workers.tasks.RequestTask`` calls ``publish_or_mark`` for that, so a task sent
directly (tests, the fault bench) is guarded the same way.
"""

from __future__ import annotations

import importlib
import logging

from django.utils import timezone
from kombu.exceptions import OperationalError

log = logging.getLogger(__name__)
RUN_REQUEST = "workers.run_request"


def app():
    from workers import app as celery_app

    return celery_app


def task(name: str):
    """The registered task ``name`` (the app's ``include`` modules imported on first use)."""
    celery_app = app()
    if name not in celery_app.tasks:
        # the modules the app lists (``include``), imported as such; not the loader's
        # import_default_modules, whose Django fix-up sets up Django (and its logging) again
        for module in celery_app.conf.include or ():
            importlib.import_module(module)
    return celery_app.tasks[name]


def send(request_id, queue: str, name: str = RUN_REQUEST):
    """Send the task of request ``request_id`` to ``queue``; None if it was marked unsent."""
    return task(name).apply_async(args=[str(request_id)], queue=queue)


def publish_or_mark(publish, request_id):
    """Run ``publish()``; when the broker cannot take the message, mark the request unsent
    (the sweep sends it) and return None instead of raising."""
    try:
        return publish()
    except OperationalError:
        log.warning("broker unavailable: the task of request %s was not sent; the recovery sweep will send it",
                    request_id, exc_info=True)
    except Exception:  # noqa: BLE001 - whatever failed, the request is safe in the database
        log.exception("the task of request %s could not be sent; the recovery sweep will send it", request_id)
    mark_unsent(request_id)
    return None


UNSENT = "unsent_at"  # a request's progress key the sweep finds it by; never shown to its analyst


def shown_progress(progress: dict | None) -> dict | None:
    """A request's progress as its analyst sees it: without the sweep's ``unsent_at`` (the
    server's clock, and the news that the broker was down: a probe saw it in the API)."""
    if not isinstance(progress, dict) or UNSENT not in progress:
        return progress
    return {k: v for k, v in progress.items() if k != UNSENT}


def mark_unsent(request_id) -> bool:
    """Rule 3 of the recovery sweep: the broker did not take the task of this queued request."""
    from ..models import Request

    if request_id is None:
        return False
    progress = Request.objects.filter(pk=request_id, status=Request.Status.QUEUED).values_list(
        "progress", flat=True).first()
    if progress is None:
        return False
    return bool(Request.objects.filter(pk=request_id, status=Request.Status.QUEUED).update(
        progress={**(progress or {}), UNSENT: timezone.now().timestamp()}))
