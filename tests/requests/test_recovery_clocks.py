"""The recovery sweep when clocks disagree or jump (a helper's probe, 2026-11-29): heartbeats
were written on each worker's clock and judged on the sweeper's, so a worker stepped back 5
minutes had 6 of its 7 healthy runs declared lost (charged in full, results dropped), one
that ran 3 hours ahead and died left its request running for hours, a web process ahead
left a lost message never re-sent, and a beat a minute behind had every sweep discarded as
expired. Heartbeats are now the database's time, the sweep's cutoff too, and a process's
sweeps watch each heartbeat on their monotonic clock."""

import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import OperationalError

from governance.models import Request
from governance.requests import recovery
from governance.requests.execution import claim
from governance.requests.recovery import db_now, sweep
from tests.requests.test_recovery import clinic, queued  # noqa: F401 - fixture

pytestmark = pytest.mark.django_db
LOST_AFTER = 0.5
DB_STARTED = recovery.db_started  # (tests/conftest.py replaces it for every test)


@pytest.fixture(autouse=True)
def fresh_watch(monkeypatch):
    monkeypatch.setattr(recovery, "WATCH", recovery.Watch())


def running(rid, heartbeat):
    Request.objects.filter(pk=rid).update(status="running", started_at=heartbeat, heartbeat_at=heartbeat,
                                          data_read=True, worker="cpu@w")


def test_the_claim_and_the_heartbeats_are_the_databases_time(api, analyst, clinic, monkeypatch,
                                                             django_capture_on_commit_callbacks):
    from django.db import connection
    from django.utils import timezone

    if connection.vendor != "postgresql":
        pytest.skip("SQLite is one host's file: its clock is the worker's")
    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() - timedelta(minutes=5))  # this worker's clock, stepped back
    req = claim(rid, worker="cpu@behind")
    monkeypatch.setattr(timezone, "now", real)
    assert abs((req.heartbeat_at - db_now()).total_seconds()) < 5
    assert abs((Request.objects.get(pk=rid).started_at - db_now()).total_seconds()) < 5
    assert sweep(lost_after=120)["lost"] == []


def test_a_heartbeat_that_keeps_changing_is_alive_whatever_the_clocks_say(api, analyst, clinic, monkeypatch,
                                                                          django_capture_on_commit_callbacks):
    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    running(rid, db_now())
    assert sweep(lost_after=LOST_AFTER)["lost"] == []  # watched from now on
    real = recovery.db_now
    monkeypatch.setattr(recovery, "db_now", lambda: real() + timedelta(hours=3))  # the clock stepped 3 h forward
    for _ in range(3):
        time.sleep(LOST_AFTER)
        Request.objects.filter(pk=rid).update(heartbeat_at=real())  # the worker's beats, 3 hours "old"
        assert sweep(lost_after=LOST_AFTER)["lost"] == [], "a live heartbeat was swept"
    time.sleep(LOST_AFTER * 1.5)  # now silent
    assert sweep(lost_after=LOST_AFTER)["lost"] == [rid]
    assert Request.objects.get(pk=rid).error["code"] == "request.worker_lost"


def test_a_heartbeat_in_the_future_that_stops_is_lost_after_the_grace_period(api, analyst, clinic,
                                                                              django_capture_on_commit_callbacks):
    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    running(rid, db_now() + timedelta(hours=3))  # a worker that ran 3 hours ahead, then died
    assert sweep(lost_after=LOST_AFTER)["lost"] == []
    time.sleep(LOST_AFTER * 1.5)
    assert sweep(lost_after=LOST_AFTER)["lost"] == [rid]


def test_after_a_failed_sweep_every_heartbeat_gets_the_grace_period_again(api, analyst, clinic, monkeypatch,
                                                                          django_capture_on_commit_callbacks):
    """A worker holding its outcome while the database was away writes it within seconds
    of its return: the sweep that follows the outage must not win that race."""
    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    running(rid, db_now())
    assert sweep(lost_after=LOST_AFTER)["lost"] == []
    real = recovery.db_now

    def away():
        raise OperationalError("the database is away")

    monkeypatch.setattr(recovery, "db_now", away)
    time.sleep(LOST_AFTER * 1.5)
    with pytest.raises(OperationalError):
        sweep(lost_after=LOST_AFTER)
    monkeypatch.setattr(recovery, "db_now", real)
    assert sweep(lost_after=LOST_AFTER)["lost"] == []  # back: watched afresh
    time.sleep(LOST_AFTER * 1.5)
    assert sweep(lost_after=LOST_AFTER)["lost"] == [rid]


def test_a_request_created_in_the_databases_future_is_sent_again(api, analyst, clinic,
                                                                 django_capture_on_commit_callbacks):
    """The web process's clock 3 hours ahead: its broker message lost, it was never old
    enough to send again."""
    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    Request.objects.filter(pk=rid).update(created_at=db_now() + timedelta(hours=3))
    assert sweep(requeue_after=900)["requeued"] == [rid]


def test_the_sweep_has_no_expiry_a_skewed_beat_could_judge():
    assert "expires" not in settings.CELERY_BEAT_SCHEDULE["sweep-lost-requests"]["options"]


def test_after_a_database_restart_a_sweep_that_saw_no_outage_gives_the_grace_period_again(
        api, analyst, clinic, monkeypatch, django_capture_on_commit_callbacks):
    """A probe's PostgreSQL restart: a sweep in a process that had seen no error (it had not
    run during the outage) marked a request lost 0.23 s after the return, its heartbeat
    older than the grace period, while its worker held the outcome to write. The
    database's start time tells of the outage."""
    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    running(rid, db_now() - timedelta(seconds=10))  # its last beat before the outage
    monkeypatch.setattr(recovery, "db_started", lambda: recovery.db_now() - timedelta(seconds=0.2))
    assert sweep(lost_after=5)["lost"] == []  # back 0.2 s ago: watched afresh
    monkeypatch.setattr(recovery, "db_started", lambda: recovery.db_now() - timedelta(days=1))
    assert sweep(lost_after=LOST_AFTER)["lost"] == []  # (watched: unchanged for LOST_AFTER of this clock)
    time.sleep(LOST_AFTER * 1.5)
    assert sweep(lost_after=LOST_AFTER)["lost"] == [rid]


def test_a_database_start_time_in_its_future_is_no_restart(api, analyst, clinic, monkeypatch,
                                                           django_capture_on_commit_callbacks):
    """The database's clock stepped back past its own start time: the difference was
    negative, so "restarted within the grace period", and every sweep watched afresh and
    swept nothing until the clock caught up (a probe's killed worker, its request running
    for good)."""
    from governance.requests.recovery import WATCH

    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    running(rid, db_now() - timedelta(seconds=600))  # a dead worker's last beat
    monkeypatch.setattr(WATCH, "seen", {})
    monkeypatch.setattr(recovery, "db_started", lambda: recovery.db_now() + timedelta(minutes=30))
    assert sweep(lost_after=5)["lost"] == [rid]


def test_the_database_s_start_time_is_read_on_postgresql():
    from django.db import connection

    started = DB_STARTED()
    if connection.vendor != "postgresql":
        assert started is None
    else:
        assert started < db_now()


def test_a_request_of_a_live_worker_seen_first_is_watched_not_swept(api, analyst, clinic, settings, tmp_path,
                                                                    django_capture_on_commit_callbacks):
    """A probe stepped the database's clock 10 minutes forward: a sweeper that had not
    watched the request yet (a fresh pool process, `manage.py recover`) read its heartbeat
    as 10 minutes old and finished the live run as lost, charged in full, its result
    dropped. Its worker's liveness record (on a clock of its own) says it is alive: it is
    watched, and swept only once its heartbeat stood still for the grace period here."""
    from governance.core import liveness

    settings.VAR_DIR, settings.REDIS_URL = tmp_path, ""
    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    running(rid, db_now() - timedelta(minutes=10))
    Request.objects.filter(pk=rid).update(worker="celery@live")
    hb = liveness.Heartbeat("celery@live", ["cpu"], interval=60).start()
    try:
        assert sweep(lost_after=LOST_AFTER)["lost"] == []
        time.sleep(LOST_AFTER * 1.5)
        assert sweep(lost_after=LOST_AFTER)["lost"] == [rid]  # it stood still: lost after all
    finally:
        hb.stop()
    # a worker with no live record: the database's clock decides at first sight, as before
    rid2 = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    running(rid2, db_now() - timedelta(minutes=10))
    Request.objects.filter(pk=rid2).update(worker="celery@gone")
    assert sweep(lost_after=LOST_AFTER)["lost"] == [rid2]


def test_a_live_worker_of_another_queue_on_the_same_node_does_not_vouch(api, analyst, clinic, settings, tmp_path,
                                                                         django_capture_on_commit_callbacks):
    """Two ``manage.py worker`` on one host, one per queue, are both ``celery@<host>``: the
    cpu one killed, the live gpu one vouched for its running request, which waited for the
    sweep's watch (minutes) where a dead worker's is finished at first sight (a probe). Only a
    live process consuming the request's own queue vouches."""
    from governance.core import liveness

    settings.VAR_DIR, settings.REDIS_URL = tmp_path, ""
    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)  # an aggregate: the cpu queue
    running(rid, db_now() - timedelta(minutes=10))
    Request.objects.filter(pk=rid).update(worker="celery@box")
    assert recovery._queue_of(Request.objects.get(pk=rid).engine) == "cpu"
    gpu = liveness.Heartbeat("celery@box", ["sweep", "gpu"], interval=60).start()
    try:
        assert sweep(lost_after=LOST_AFTER)["lost"] == [rid]  # the gpu process does not vouch
        rid2 = queued(api(analyst), capture=django_capture_on_commit_callbacks)
        running(rid2, db_now() - timedelta(minutes=10))
        Request.objects.filter(pk=rid2).update(worker="celery@box")
        cpu = liveness.Heartbeat("celery@box", ["sweep", "cpu"], interval=60)
        cpu.record["pid"] = cpu.record["pid"] + 1  # another process of the same node
        cpu.beat()
        assert sweep(lost_after=LOST_AFTER)["lost"] == []  # a live cpu process of its node: watched
    finally:
        gpu.stop()


def test_a_live_process_of_the_same_id_started_since_does_not_vouch(api, analyst, clinic, settings, tmp_path,
                                                                   django_capture_on_commit_callbacks):
    """A probe killed a container's worker (pid 1) and the container started it again, pid 1
    again under the same node name: its record vouched for the dead one's running request.
    The claim names the process by its id and start time; only that process vouches."""
    from governance.core import liveness

    settings.VAR_DIR, settings.REDIS_URL = tmp_path, ""
    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    running(rid, db_now() - timedelta(minutes=10))
    hb = liveness.Heartbeat("celery@box", ["cpu"], interval=60)
    pid = hb.record["pid"]
    Request.objects.filter(pk=rid).update(worker="celery@box", worker_process=f"{pid}@1")  # the dead one's start
    hb.start()
    try:
        assert hb.record["process"] == liveness.process_key(pid) != f"{pid}@1"
        assert sweep(lost_after=LOST_AFTER)["lost"] == [rid]  # same node, same id, started since: lost
        rid2 = queued(api(analyst), capture=django_capture_on_commit_callbacks)
        running(rid2, db_now() - timedelta(minutes=10))
        Request.objects.filter(pk=rid2).update(worker="celery@box", worker_process=hb.record["process"])
        assert sweep(lost_after=LOST_AFTER)["lost"] == []  # its own process, alive: watched
    finally:
        hb.stop()


def test_the_liveness_records_are_read_only_when_a_request_seen_first_looks_stale(
        api, analyst, clinic, monkeypatch, django_capture_on_commit_callbacks):
    """Every sweep read them (one Redis call, or a listing of the embedded broker's folder),
    though they decide only for a request not watched before whose heartbeat is old."""
    reads = []
    monkeypatch.setattr(recovery, "_live_nodes", lambda: reads.append(1) or {})
    rid = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    running(rid, db_now())
    assert sweep(lost_after=LOST_AFTER)["lost"] == [] and reads == []  # recent: watched, none read
    assert sweep()["lost"] == [] and reads == []  # watched: this process's clock decides
    rid2 = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    running(rid2, db_now() - timedelta(minutes=10))
    rid3 = queued(api(analyst), capture=django_capture_on_commit_callbacks)
    running(rid3, db_now() - timedelta(minutes=10))
    # rid's run beats again (the two queued above took over LOST_AFTER in a loaded CI run,
    # and rid, watched since, was taken for lost too)
    Request.objects.filter(pk=rid).update(heartbeat_at=db_now())
    assert sorted(sweep(lost_after=LOST_AFTER)["lost"]) == sorted([rid2, rid3]) and reads == [1]  # once a sweep
