"""A broker outage while a request is submitted (found by bench/bench_faults.py: during a
Redis restart, POSTs of requests that had been admitted and charged were answered 500, so
their analysts never learnt the id). The task is sent after the commit; when it cannot be
sent, the POST is answered 202, the request stays ``queued`` marked unsent, and the next
recovery sweep sends it (governance/requests/recovery.py, rule 3).

Two failures were seen: Celery's ``OperationalError`` once its publish retries are spent
(Redis down), and, more rarely, kombu's Redis channel torn down under a publish by another
thread's reconnection (``AttributeError: 'NoneType' object has no attribute 'client'``
from ``kombu/transport/redis.py`` ``_connparams``: 1 POST in 10 full fault runs)."""

import socket

import pytest
from celery.app.task import Task
from kombu.exceptions import OperationalError

from governance.audit import verification
from governance.models import LedgerEntry, Request
from governance.requests.recovery import sweep

URL = "/api/requests/"
COUNT = {"dataset": "clinic", "engine": "aggregates", "kind": "count", "params": {"epsilon": 0.25}}


@pytest.fixture
def clinic(make_dataset, analyst, grant):
    ds = make_dataset(epsilon=1.0)
    grant(analyst, ds)
    return ds


FAILURES = {
    "redis down": OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
    "channel torn down": AttributeError("'NoneType' object has no attribute 'client'"),
}


class Broker:
    """Stands in for Celery's publish (``Task.apply_async``, which ``RequestTask`` calls): while
    down it raises ``failure``."""

    def __init__(self, failure):
        self.failure = failure
        self.up = False
        self.sent = []

    def apply_async(self, task, args=None, kwargs=None, **options):
        if not self.up:
            raise self.failure
        self.sent.append(args[0])


@pytest.fixture(params=sorted(FAILURES))
def broker(request, monkeypatch):
    from workers import app

    b = Broker(FAILURES[request.param])
    monkeypatch.setattr(Task, "apply_async", lambda task, args=None, kwargs=None, **o: b.apply_async(
        task, args, kwargs, **o))
    eager = app.conf.task_always_eager
    app.conf.task_always_eager = False  # a message is sent, as in production
    yield b
    app.conf.task_always_eager = eager


@pytest.mark.django_db(transaction=True)  # the task is sent on the real commit, inside the POST
def test_a_post_while_the_broker_is_down_is_answered_and_sent_by_the_next_sweep(api, analyst, clinic, broker):
    r = api(analyst).post(URL, COUNT, format="json")
    assert r.status_code == 202, r.content
    rid = r.json()["id"]
    req = Request.objects.get(pk=rid)
    assert req.status == "queued" and "unsent_at" in req.progress
    assert LedgerEntry.objects.get().status == "reserved"

    assert sweep(requeue_after=3600)["requeued"] == [rid]  # still down: tried, and kept for the next sweep
    assert "unsent_at" in Request.objects.get(pk=rid).progress and broker.sent == []

    broker.up = True
    assert sweep(requeue_after=3600)["requeued"] == [rid]  # sent at once, not after REQUEST_REQUEUE_AFTER_SECONDS
    assert broker.sent == [rid]
    progress = Request.objects.get(pk=rid).progress
    assert "unsent_at" not in progress and "requeued_at" in progress
    assert sweep(requeue_after=3600)["requeued"] == []  # now rule 2's period applies: not sent twice
    assert LedgerEntry.objects.get().status == "reserved" and verification.verify().ok


@pytest.mark.django_db
def test_celery_raises_what_the_task_catches_when_redis_refuses(api, analyst, clinic,
                                                                django_capture_on_commit_callbacks):
    """The real publish to a Redis that refuses connections, not a stand-in."""
    from workers import app
    from workers.tasks import run_request

    with django_capture_on_commit_callbacks(execute=False):
        rid = api(analyst).post(URL, COUNT, format="json").json()["id"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends
    eager = app.conf.task_always_eager
    app.conf.task_always_eager = False
    try:
        with app.connection_for_write(f"redis://127.0.0.1:{port}/0") as conn:
            sent = run_request.apply_async(args=[rid], queue="cpu", connection=conn, retry_policy={
                "max_retries": 1, "interval_start": 0, "interval_step": 0.1, "interval_max": 0.1})
    finally:
        app.conf.task_always_eager = eager
    assert sent is None
    req = Request.objects.get(pk=rid)
    assert req.status == "queued" and "unsent_at" in req.progress


@pytest.mark.django_db
def test_a_post_while_the_rate_limit_cache_is_down_is_not_a_500(api, analyst, clinic, settings,
                                                                django_capture_on_commit_callbacks):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings.REQUEST_RATE_LIMIT = "600/min"
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": f"redis://127.0.0.1:{port}/0"}}
    with django_capture_on_commit_callbacks(execute=False):
        r = api(analyst).post(URL, COUNT, format="json")
    assert r.status_code == 202
