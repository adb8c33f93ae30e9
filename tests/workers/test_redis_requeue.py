"""Rule 2 of the recovery sweep on Redis: a queued request is sent again when Redis holds no
message of it (lost with a Redis restart without persistence, or never sent because the web
process died between its commit and its publish), and only then.

Before, Redis's period was 6 h with no look at the broker: a helper's probe (kill -9 of
gunicorn between commit and publish; Redis restarted without its append-only file) left
admitted requests queued, budget reserved, for hours. The messages here are real: sent
through the service's own Celery app to a real Redis, one of them taken by a consumer
that never acknowledges it (a worker that died holding it)."""

from datetime import timedelta

import pytest
from django.utils import timezone
from kombu import Connection

from governance.models import Request

from .test_embedded_broker import _queued, clinic  # noqa: F401 - fixture


@pytest.fixture
def on_redis(redis_server, settings):
    from workers import app

    settings.EMBEDDED_BROKER = False
    old = app.conf.broker_url
    app.conf.broker_url = redis_server
    try:
        yield redis_server
    finally:
        app.conf.broker_url = old


def _send(url, rid, queue="cpu"):
    import warnings

    from celery.exceptions import AlwaysEagerIgnored

    from workers import app

    with Connection(url) as conn, warnings.catch_warnings():
        warnings.simplefilter("ignore", AlwaysEagerIgnored)
        app.send_task("workers.run_request", args=[str(rid)], queue=queue, connection=conn)


@pytest.mark.django_db
def test_the_sweep_resends_only_what_redis_does_not_hold(api, analyst, clinic, on_redis, monkeypatch):  # noqa: F811
    from governance.requests import recovery, submission
    from workers import app

    waiting, taken, lost = _queued(api(analyst), 3)
    _send(on_redis, waiting)
    _send(on_redis, taken)
    with app.connection_for_read(on_redis) as conn:  # a worker that takes a message and dies with it
        ch = conn.channel()
        message = ch.basic_get("cpu", no_ack=False)
        assert message is not None
        ch.qos.restore_unacked_once = ch.qos.restore_unacked = lambda *a, **k: None  # it dies: nothing put back
    # the first message sent is taken first (LPUSH / BRPOP): which request it carries
    taken_id = {waiting: waiting, taken: taken}[message.headers["argsrepr"].strip("()[],' ")]
    others = {waiting, taken} - {taken_id}
    Request.objects.filter(pk__in=[waiting, taken, lost]).update(created_at=timezone.now() - timedelta(minutes=5))
    sent = []
    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: sent.append(str(pk)))
    assert recovery.sweep(requeue_after=60)["requeued"] == [lost]
    assert sent == [lost] and taken_id not in sent and not others & set(sent)


@pytest.mark.django_db
def test_a_broker_that_cannot_be_read_resends_nothing(api, analyst, clinic, settings, monkeypatch):  # noqa: F811
    from governance.requests import recovery, submission
    from workers import app

    settings.EMBEDDED_BROKER = False
    monkeypatch.setattr(app.conf, "broker_url", "redis://127.0.0.1:1/0")  # nothing listens
    rid = _queued(api(analyst), 1)[0]
    Request.objects.filter(pk=rid).update(created_at=timezone.now() - timedelta(minutes=5))
    sent = []
    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: sent.append(str(pk)))
    assert recovery.sweep(requeue_after=60)["requeued"] == [] and sent == []


def test_the_requeue_default_is_a_minute_on_both_brokers():
    import os
    import subprocess
    import sys

    from .conftest import ROOT

    code = "import django; django.setup(); from django.conf import settings as s; print(s.REQUEST_REQUEUE_AFTER_SECONDS)"
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "CELERY_BROKER_URL",
                                                            "REQUEST_REQUEUE_AFTER_SECONDS")}
    env["DJANGO_SETTINGS_MODULE"] = "governance.settings"
    for extra in ({}, {"REDIS_URL": "redis://127.0.0.1:6379/0"}):
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**env, **extra}, capture_output=True,
                             text=True, timeout=120)
        assert out.stdout.strip() == "60", out.stderr[-2000:]
