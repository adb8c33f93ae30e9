"""Release-path timing: what an analyst sees of a run changes only on the run's ticks
(RELEASE_QUANTUM_MS from the claim), never when the sampler or the query happens to finish."""

import time

import pytest

from governance.requests.execution import RunClock
from governance.models import LedgerEntry, Request

from .conftest import wait_for

QUANTUM_S = 2.0
ENGINE_PHASES = {"filtering", "bounding contributions", "aggregating", "adding noise", "done"}


def test_ticks_start_one_quantum_after_the_claim(settings):
    settings.RELEASE_QUANTUM_MS = 250
    clock = RunClock("r")
    t0 = clock.t0
    assert clock.next_tick(t0) == pytest.approx(t0 + 0.25)
    assert clock.next_tick(t0 + 0.01) == pytest.approx(t0 + 0.25)
    assert clock.next_tick(t0 + 0.25) == pytest.approx(t0 + 0.25)
    assert clock.next_tick(t0 + 0.2501) == pytest.approx(t0 + 0.5)
    settings.RELEASE_QUANTUM_MS = 0
    assert RunClock("r").next_tick(t0 + 7.3) == t0 + 7.3


@pytest.mark.django_db
def test_an_eager_run_is_released_on_its_first_tick(settings, api, analyst, make_dataset, grant,
                                                    django_capture_on_commit_callbacks):
    settings.RELEASE_QUANTUM_MS = 700
    ds = make_dataset(epsilon=5.0)
    grant(analyst, ds)
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=True):
        r = client.post("/api/requests/", {"dataset": ds.name, "engine": "aggregates", "kind": "count",
                                           "params": {"epsilon": 1.0}}, format="json")
    assert r.status_code == 202
    req = Request.objects.get(pk=r.json()["id"])
    assert req.status == "succeeded"
    assert (req.finished_at - req.started_at).total_seconds() >= 0.7


@pytest.fixture
def ticks(monkeypatch):
    monkeypatch.setenv("RELEASE_QUANTUM_MS", str(int(QUANTUM_S * 1000)))


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_shows_progress_and_outcome_only_on_ticks(ticks, real_worker, api, analyst, make_dataset,
                                                                grant):
    ds = make_dataset(epsilon=5.0)
    grant(analyst, ds)
    client = api(analyst)
    for eps in (0.5, 1.0, 2.0):
        r = client.post("/api/requests/", {"dataset": ds.name, "engine": "aggregates", "kind": "count",
                                           "params": {"epsilon": eps, "group_by": "site"}}, format="json")
        assert r.status_code == 202, r.content
        rid = r.json()["id"]
        seen = []  # (wall time, status, phase) as the analyst polls

        def done():
            body = client.get(f"/api/requests/{rid}/").json()
            seen.append((time.time(), body["status"], (body["progress"] or {}).get("phase")))
            return body if body["status"] in ("succeeded", "failed", "cancelled") else None

        body = wait_for(done, interval=0.02)
        assert body["status"] == "succeeded", body
        req = Request.objects.get(pk=rid)
        started = req.started_at.timestamp()
        # a grouped count takes well under a second here; it is shown on the first tick
        assert (req.finished_at - req.started_at).total_seconds() >= QUANTUM_S
        engine_seen = [t for t, status, phase in seen if phase in ENGINE_PHASES or status == "succeeded"]
        assert engine_seen and min(engine_seen) >= started + QUANTUM_S - 0.05, seen


@pytest.mark.django_db(transaction=True)
def test_a_cancellation_reaches_a_real_training_run_through_the_clock(ticks, real_worker, api, analyst,
                                                                     make_dataset, grant):
    """The engine's reports go through the clock thread: a cancellation is seen at its next
    write and raised at the engine's next report; the steps taken are charged."""
    from tests.real_data import GSS_SCHEMA, GSS_TRAIN, gss_wages

    grant(analyst, make_dataset("gss", epsilon=10.0, frame=gss_wages(), schema=GSS_SCHEMA))
    client = api(analyst)
    r = client.post("/api/requests/", {"dataset": "gss", "engine": "dpsgd", "kind": "train", "params": {
        **GSS_TRAIN, "target_epsilon": 3.0, "epochs": 30, "batch_size": 256, "canaries": 0}}, format="json")
    assert r.status_code == 202, r.content
    rid = r.json()["id"]

    def training():
        body = client.get(f"/api/requests/{rid}/").json()
        return (body["progress"] or {}).get("phase", "").startswith("training")

    wait_for(training, timeout=180)
    assert client.post(f"/api/requests/{rid}/cancel/").status_code == 200
    body = wait_for(lambda: (b := client.get(f"/api/requests/{rid}/").json())["status"] != "running" and b,
                    timeout=120)
    assert body["status"] == "cancelled", body
    assert body["charge"]["ledger_status"] == "committed"
    reserved = LedgerEntry.objects.get(request=rid).charge["rdp"]["epsilon"]
    assert 0 < body["charge"]["rdp"]["epsilon"] < reserved  # the steps taken, not the 30 epochs planned


@pytest.mark.django_db
def test_a_dataset_s_own_quantum_replaces_the_server_default(settings, api, analyst, make_dataset, grant,
                                                              django_capture_on_commit_callbacks):
    from governance.requests.execution import quantum_ms

    settings.RELEASE_QUANTUM_MS = 0
    ds = make_dataset(epsilon=5.0)
    grant(analyst, ds)
    assert quantum_ms(ds) == 0
    ds.release_quantum_ms = 400
    ds.save(update_fields=["release_quantum_ms"])
    assert quantum_ms(ds) == 400
    with django_capture_on_commit_callbacks(execute=True):
        r = api(analyst).post("/api/requests/", {"dataset": ds.name, "engine": "aggregates", "kind": "count",
                                                 "params": {"epsilon": 1.0}}, format="json")
    req = Request.objects.get(pk=r.json()["id"])
    assert req.status == "succeeded" and (req.finished_at - req.started_at).total_seconds() >= 0.4
    settings.RELEASE_QUANTUM_MS = 1000
    ds.release_quantum_ms = 0  # the officer's explicit choice wins over the default too
    assert quantum_ms(ds) == 0 and RunClock("r", quantum_ms(ds)).next_tick(5.0) == 5.0


@pytest.mark.django_db
def test_the_officer_sees_and_changes_the_quantum_in_the_admin_within_bounds(client, officer, make_dataset, caplog):
    import json

    from django.contrib.admin.models import LogEntry

    ds = make_dataset()
    client.force_login(officer)
    url = f"/admin/governance/dataset/{ds.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200 and b"release_quantum_ms" in page.content and b"server default" in page.content
    form = {"title": "t", "description": "", "schema": json.dumps(ds.schema), "budget_epsilon": "1.0",
            "budget_delta_text": "auto"}
    for bad in ("60001", "-1", "abc"):
        r = client.post(url, {**form, "release_quantum_ms": bad})
        assert r.status_code == 200 and b"errornote" in r.content, bad  # the form shows the error, saves nothing
    ds.refresh_from_db()
    assert ds.release_quantum_ms is None
    with caplog.at_level("WARNING", logger="governance.datasets.registry"):
        r = client.post(url, {**form, "release_quantum_ms": "50"})
    assert r.status_code == 302
    ds.refresh_from_db()
    assert ds.release_quantum_ms == 50
    assert "release clock changed from None to 50 ms" in caplog.text
    assert "Release clock (ms)" in LogEntry.objects.get(object_id=str(ds.pk)).get_change_message()
    r = client.post(url, {**form, "release_quantum_ms": ""})  # blank: back to the server default
    ds.refresh_from_db()
    assert r.status_code == 302 and ds.release_quantum_ms is None


@pytest.mark.django_db(transaction=True)
def test_a_worker_claims_the_next_request_on_the_last_run_s_tick(ticks, real_worker, api, analyst, make_dataset,
                                                                 grant):
    """One worker process (solo pool): the second request is claimed on the first run's
    tick, when its outcome is written, and each outcome appears only on its own run's tick.
    A probe read the first run's exact, data-dependent duration from the second's
    ``started_at`` when the claim came the moment the first run's engine finished."""
    ds = make_dataset(epsilon=5.0)
    grant(analyst, ds)
    client = api(analyst)
    ids = []
    for eps in (0.5, 1.0):
        r = client.post("/api/requests/", {"dataset": ds.name, "engine": "aggregates", "kind": "count",
                                           "params": {"epsilon": eps}}, format="json")
        assert r.status_code == 202, r.content
        ids.append(r.json()["id"])
    body = client.get(f"/api/requests/{ids[1]}/?wait=30").json()
    assert body["status"] == "succeeded", body
    first, second = (Request.objects.get(pk=i) for i in ids)
    assert first.status == "succeeded"
    offset = (second.started_at - first.started_at).total_seconds()  # one clock: the database's, or this host's
    ticks_in = round(offset / QUANTUM_S)
    assert ticks_in >= 1 and abs(offset - ticks_in * QUANTUM_S) < 0.25 * QUANTUM_S, offset  # on the first's tick
    assert abs((second.started_at - first.finished_at).total_seconds()) < 0.25 * QUANTUM_S
    for req in (first, second):
        assert (req.finished_at - req.started_at).total_seconds() >= QUANTUM_S
        assert LedgerEntry.objects.get(pk=req.ledger_entry_id).status == "committed"


def test_the_releaser_writes_each_outcome_at_its_tick_in_order_and_drains():
    from governance.requests.releaser import Releaser

    r = Releaser()
    now = time.monotonic()
    seen = []
    r.at(now + 0.30, lambda: seen.append(("b", time.monotonic())))
    r.at(now + 0.15, lambda: seen.append(("a", time.monotonic())))
    r.at(now + 0.20, lambda: 1 / 0)  # a failing write is logged; the others still run
    assert r.pending() == 3 and seen == []
    assert r.drain(timeout=10)
    assert [name for name, _ in seen] == ["a", "b"] and r.pending() == 0
    assert seen[0][1] >= now + 0.15 and seen[1][1] >= now + 0.30  # never before its tick
