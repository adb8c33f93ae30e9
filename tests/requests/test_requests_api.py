"""Requests end to end through the REST API, with Celery eager: admitted, refused,
cancelled, failed before and after the read, replayed, and hidden from other analysts."""

import pytest

from governance.audit import verification
from governance.models import LedgerEntry, Request

pytestmark = pytest.mark.django_db
URL = "/api/requests/"


@pytest.fixture
def clinic(make_dataset, analyst, grant):
    ds = make_dataset(epsilon=1.0)
    grant(analyst, ds)
    return ds


def post(client, params, kind="count", engine="probe", dataset="clinic"):
    return client.post(URL, {"dataset": dataset, "engine": engine, "kind": kind, "params": params}, format="json")


def test_it_runs_an_admitted_request_and_commits_its_charge(api, analyst, clinic, django_capture_on_commit_callbacks):
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=True):
        r = post(client, {"epsilon": 0.25})
    assert r.status_code == 202 and r.json()["status"] == "queued"
    body = client.get(f"{URL}{r.json()['id']}/").json()
    assert body["status"] == "succeeded" and body["result"] == {"rows": 200}
    assert body["charge"]["ledger_status"] == "committed"
    assert body["charge"]["basic"]["epsilon"] == pytest.approx(0.25)
    assert body["progress"]["fraction"] == 1.0
    assert LedgerEntry.objects.get().status == "committed"


def test_it_refuses_with_409_and_writes_nothing(api, analyst, clinic):
    r = post(api(analyst), {"epsilon": 1.5})
    assert r.status_code == 409
    body = r.json()
    assert body["code"] == "budget.exceeded" and body["remaining_epsilon"] == pytest.approx(1.0)
    assert not Request.objects.exists() and not LedgerEntry.objects.exists()


def test_it_cancels_a_queued_request_and_refunds(api, analyst, clinic, django_capture_on_commit_callbacks):
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        r = post(client, {"epsilon": 0.5})
    rid = r.json()["id"]
    c = client.post(f"{URL}{rid}/cancel/")
    assert c.status_code == 200 and c.json()["status"] == "cancelled"
    assert c.json()["charge"]["rdp"]["epsilon"] == 0
    for callback in callbacks:  # the task arrives after the cancellation: nothing happens
        callback()
    assert Request.objects.get(pk=rid).status == "cancelled"
    assert LedgerEntry.objects.get().status == "released"
    assert client.post(f"{URL}{rid}/cancel/").status_code == 409


def test_a_cancellation_while_running_stops_the_run_and_keeps_the_charge(api, analyst, clinic,
                                                                        cancel_as_the_engine_starts,
                                                                        django_capture_on_commit_callbacks):
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=True):
        rid = post(client, {"epsilon": 0.1}, kind="stepwise").json()["id"]
    req = Request.objects.get(pk=rid)
    assert req.status == "cancelled" and req.data_read
    assert LedgerEntry.objects.get().status == "committed"


def test_a_cancellation_before_the_read_is_refunded(api, analyst, clinic, django_capture_on_commit_callbacks):
    """Asked after a worker claimed the request but before it read a row (a probe's cancel
    while the worker loaded torch: the worker went on to read the rows and charged the whole
    reservation, no step taken): nothing is read, the reservation is refunded."""
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        rid = post(client, {"epsilon": 0.1}, kind="stepwise").json()["id"]
    Request.objects.filter(pk=rid).update(status="running", cancel_requested=True)  # claimed, then asked
    Request.objects.filter(pk=rid).update(status="queued")  # (the task claims it again as it would have)
    for callback in callbacks:
        callback()
    req = Request.objects.get(pk=rid)
    assert (req.status, req.error["code"], req.data_read, req.result) == ("cancelled", "request.cancelled", False,
                                                                          None)
    assert "refunded" in req.error["detail"] and LedgerEntry.objects.get().status == "released"


def test_it_refunds_a_failure_before_the_data_is_read(api, analyst, clinic, settings,
                                                      django_capture_on_commit_callbacks):
    (settings.DATA_DIR / clinic.file).unlink()
    with django_capture_on_commit_callbacks(execute=True):
        rid = post(api(analyst), {"epsilon": 0.5}).json()["id"]
    req = Request.objects.get(pk=rid)
    assert req.status == "failed" and req.error["code"] == "request.failed_before_read"
    assert LedgerEntry.objects.get().status == "released"
    # a fixed text (a read's message can quote a row), without where the server keeps its tables
    assert "no longer as registered" in req.error["detail"] and clinic.file not in req.error["detail"]
    assert str(settings.DATA_DIR) not in req.error["detail"]
    assert "No such file" in req.officer_report["failure"]  # the officer's page says why


def test_an_engine_that_cannot_load_fails_before_the_read_refunded(api, analyst, clinic,
                                                                   django_capture_on_commit_callbacks):
    """What the engine imports (torch for DP-SGD) is loaded before the read (its ``prepare``
    hook): a worker that cannot load it (a probe: ``import torch`` under an address-space
    cap, after the read, was charged as a failure after the read) is refunded."""
    from engines import plugins
    from engines.hookspecs import hookimpl

    class Unloadable:
        @hookimpl
        def prepare(self, engine):
            if engine == "probe":
                raise MemoryError("cannot allocate memory loading the engine's libraries")

    plugins.pm.register(Unloadable(), name="unloadable")
    try:
        with django_capture_on_commit_callbacks(execute=True):
            rid = post(api(analyst), {"epsilon": 0.5}).json()["id"]
    finally:
        plugins.pm.unregister(name="unloadable")
    req = Request.objects.get(pk=rid)
    assert (req.status, req.error["code"], req.data_read) == ("failed", "request.failed_before_read", False)
    assert "cannot allocate memory" in req.error["detail"] and req.ledger_entry.status == "released"


def test_a_plan_of_another_version_fails_before_the_read_refunded(api, analyst, clinic,
                                                                 django_capture_on_commit_callbacks):
    """A request planned by one version of the service and run by a worker of another (queued
    across an upgrade): refused before the read and refunded, not failed after it and charged."""
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        r = post(client, {"epsilon": 0.5}, kind="count", engine="aggregates")
    assert r.status_code == 202, r.json()
    req = Request.objects.get(pk=r.json()["id"])
    req.plan = {**req.plan, "details": {**req.plan["details"], "version": 0}}
    req.save(update_fields=["plan"])
    for callback in callbacks:
        callback()
    req.refresh_from_db()
    assert (req.status, req.error["code"], req.data_read) == ("failed", "request.failed_before_read", False)
    assert "another version of the aggregates engine" in req.error["detail"]
    assert req.ledger_entry.status == "released"


def test_every_built_in_engine_loads_its_run_before_the_read():
    import subprocess
    import sys

    code = ("import sys; from engines import plugins; before = 'torch' in sys.modules\n"
            "for e in ('aggregates', 'dpsgd', 'synthesis', 'federated'): plugins.prepare(e)\n"
            "print(before, 'torch' in sys.modules, all(f'engines.{e}.execute' in sys.modules for e in "
            "('aggregates', 'dpsgd', 'synthesis', 'federated')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["False", "True", "True"], out.stderr[-2000:]


def test_a_full_results_disk_fails_the_request_at_once_with_the_rule_s_charge(api, analyst, clinic, monkeypatch,
                                                                              django_capture_on_commit_callbacks):
    """No scratch directory (the results disk full): refused before the read, refunded. The
    files of a finished run not kept: failed after the read, charged. Both at once and
    said so (before: the task's error left the request running until the sweep called its
    worker lost, charged in full)."""
    import errno
    import shutil

    from governance.requests import execution

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(execution, "scratch_dir", full)
        with django_capture_on_commit_callbacks(execute=True):
            rid = post(api(analyst), {"epsilon": 0.25}).json()["id"]
    req = Request.objects.get(pk=rid)
    assert (req.status, req.error["code"]) == ("failed", "request.failed_before_read")
    assert "No space left on device" in req.error["detail"] and req.ledger_entry.status == "released"
    with monkeypatch.context() as m:
        m.setattr(execution, "_keep_files", full)
        with django_capture_on_commit_callbacks(execute=True):
            rid = post(api(analyst), {"epsilon": 0.3}).json()["id"]
    req = Request.objects.get(pk=rid)
    assert (req.status, req.error["code"]) == ("failed", "request.failed_after_read") and req.result is None
    assert "No space left on device" in req.error["detail"] and req.ledger_entry.status == "committed"
    # the engine's own files (a model, a synthetic table) hit the full disk: said so, charged
    with monkeypatch.context() as m:
        m.setattr(execution.plugins, "run", full)
        with django_capture_on_commit_callbacks(execute=True):
            rid = post(api(analyst), {"epsilon": 0.2}).json()["id"]
    req = Request.objects.get(pk=rid)
    assert (req.status, req.error["code"]) == ("failed", "request.failed_after_read") and req.result is None
    assert "storage is full" in req.error["detail"] and req.ledger_entry.status == "committed"
    # a results disk remounted read-only under the run (a probe): said so too, not "the engine failed"

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    with monkeypatch.context() as m:
        m.setattr(execution.plugins, "run", read_only)
        with django_capture_on_commit_callbacks(execute=True):
            rid = post(api(analyst), {"epsilon": 0.1}).json()["id"]
    req = Request.objects.get(pk=rid)
    assert "storage is full, read-only or gone" in req.error["detail"] and req.ledger_entry.status == "committed"
    # the results directory removed under the run (a probe's mv): emptying the scratch raised
    # too, no outcome was written, and the request stayed "running" until the sweep's
    # "worker lost" minutes later

    def vanish(engine, request, meta, data, plan, progress, workdir):
        (workdir / "model.pt").write_bytes(b"half")
        shutil.rmtree(workdir.parent.parent)
        raise RuntimeError("parent directory does not exist")

    with monkeypatch.context() as m:
        m.setattr(execution.plugins, "run", vanish)
        with django_capture_on_commit_callbacks(execute=True):
            rid = post(api(analyst), {"epsilon": 0.1}).json()["id"]
    req = Request.objects.get(pk=rid)
    assert (req.status, req.error["code"]) == ("failed", "request.failed_after_read"), req.error
    assert "gone" in req.error["detail"] and req.ledger_entry.status == "committed"


def test_it_keeps_the_charge_of_a_failure_after_the_read_and_hides_its_message(
        api, analyst, clinic, django_capture_on_commit_callbacks):
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=True):
        rid = post(client, {"epsilon": 0.5}, kind="fail").json()["id"]
    body = client.get(f"{URL}{rid}/").json()
    assert body["status"] == "failed" and body["error"]["code"] == "request.failed_after_read"
    assert "secret" not in str(body)
    assert LedgerEntry.objects.get().status == "committed"


def test_it_commits_the_smaller_event_a_run_reports(api, analyst, clinic, django_capture_on_commit_callbacks):
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=True):
        rid = post(client, {"epsilon": 0.1}, kind="stepwise").json()["id"]
    body = client.get(f"{URL}{rid}/").json()
    assert body["status"] == "succeeded"
    assert body["event"]["count"] == 4  # reserved
    assert body["charge"]["basic"]["epsilon"] == pytest.approx(0.2)  # committed: 2 of 4 steps


def test_it_replays_an_identical_request_for_free_with_the_same_answer(api, analyst, clinic,
                                                                       django_capture_on_commit_callbacks):
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=True):
        first = post(client, {"epsilon": 0.5}).json()
    again = post(client, {"epsilon": 0.5})
    assert again.status_code == 200
    body = again.json()
    assert body["replayed"] and body["replay_of"] == first["id"] and body["status"] == "succeeded"
    assert body["result"] == client.get(f"{URL}{first['id']}/").json()["result"]
    assert body["charge"]["rdp"]["epsilon"] == 0
    assert LedgerEntry.objects.count() == 1


def test_a_replay_stamped_before_its_release_is_never_replayed_itself(api, analyst, clinic,
                                                                     django_capture_on_commit_callbacks):
    """A web process whose clock was behind stamped a replay before the release it replays;
    ordered by time it became the "first answer", later replays pointed at it and their
    files were a 404 for good (a probe). A replay always names the release."""
    from datetime import timedelta

    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=True):
        first = post(client, {"epsilon": 0.5}).json()
    skewed = post(client, {"epsilon": 0.5}).json()
    Request.objects.filter(pk=skewed["id"]).update(created_at=Request.objects.get(pk=first["id"]).created_at
                                                   - timedelta(minutes=10))
    later = post(client, {"epsilon": 0.5}).json()
    assert skewed["replay_of"] == later["replay_of"] == first["id"]


def test_after_the_officer_corrects_the_schema_the_same_request_is_a_new_question(
        api, analyst, officer, clinic, django_capture_on_commit_callbacks):
    """A probe: after a bound or a domain was corrected, the identical request came back as
    a free replay of the release made under the old declaration (a mean of 10.48 after the
    bounds became [0, 5]; a synthetic table breaking the new integer declaration)."""
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=True):
        first = post(client, {"epsilon": 0.2}).json()
    r = api(officer).patch(f"/api/datasets/{clinic.name}/", {"schema": {"age": {"lower": 18, "upper": 65}}},
                           format="json")
    assert r.status_code == 200, r.content
    with django_capture_on_commit_callbacks(execute=True):
        again = post(client, {"epsilon": 0.2})
    assert again.status_code == 202 and not again.json()["replayed"], again.content
    assert again.json()["id"] != first["id"] and LedgerEntry.objects.count() == 2
    # asked again under the new declaration: a replay of the new release
    replay = post(client, {"epsilon": 0.2}).json()
    assert replay["replayed"] and replay["replay_of"] == again.json()["id"]
    # an Idempotency-Key's retry is the same POST whatever changed since: the earlier request
    with django_capture_on_commit_callbacks(execute=True):
        keyed = client.post(URL, {"dataset": "clinic", "engine": "probe", "kind": "count", "params": {"epsilon": 0.1}},
                            format="json", HTTP_IDEMPOTENCY_KEY="k-9").json()
    api(officer).patch(f"/api/datasets/{clinic.name}/", {"schema": {"age": {"lower": 18, "upper": 70}}}, format="json")
    retry = client.post(URL, {"dataset": "clinic", "engine": "probe", "kind": "count", "params": {"epsilon": 0.1}},
                        format="json", HTTP_IDEMPOTENCY_KEY="k-9")
    assert retry.status_code in (200, 202) and retry.json()["id"] == keyed["id"], retry.content


def test_a_replay_racing_a_revocation_is_refused_under_the_lock(api, analyst, officer, clinic,
                                                                django_capture_on_commit_callbacks):
    """The API looks the grant up before the lock; a revocation landing after that lookup
    is seen by the replay's own check under the budget row lock (a refusal with its record),
    not served from the stored release."""
    from governance.core.errors import NoGrant
    from governance.ledger import grants
    from governance.models import AuditRecord, Grant
    from governance.requests import submission

    with django_capture_on_commit_callbacks(execute=True):
        post(api(analyst), {"epsilon": 0.5})
    grants.revoke(Grant.objects.get(analyst=analyst, dataset=clinic), officer)  # after the API's lookup
    with pytest.raises(NoGrant):
        submission.submit(analyst, clinic, "probe", "count", {"epsilon": 0.5})
    assert not Request.objects.filter(replay_of__isnull=False).exists()
    assert AuditRecord.objects.filter(action="refuse", reason="grant.missing").count() == 1
    assert not AuditRecord.objects.filter(action="replay").exists()


def test_another_analysts_request_is_not_found(api, analyst, analyst2, clinic, grant,
                                               django_capture_on_commit_callbacks):
    grant(analyst2, clinic)
    with django_capture_on_commit_callbacks(execute=True):
        rid = post(api(analyst), {"epsilon": 0.2}).json()["id"]
    other = api(analyst2)
    assert other.get(f"{URL}{rid}/").status_code == 404
    assert other.post(f"{URL}{rid}/cancel/").status_code == 404
    assert other.get(URL).json()["count"] == 0
    # ...and replays are per analyst: bob pays for his own copy.
    with django_capture_on_commit_callbacks(execute=True):
        assert post(other, {"epsilon": 0.2}).status_code == 202


def test_an_officer_sees_requests_but_not_their_results(api, officer, analyst, clinic,
                                                        django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        rid = post(api(analyst), {"epsilon": 0.2}).json()["id"]
    body = api(officer).get(f"{URL}{rid}/").json()
    assert body["status"] == "succeeded" and body["result"] is None


@pytest.mark.parametrize("payload,code", [
    ({"dataset": "clinic", "engine": "nope", "kind": "count", "params": {"epsilon": 0.1}}, "engine.unknown"),
    ({"dataset": "clinic", "engine": "probe", "kind": "nope", "params": {"epsilon": 0.1}}, "request.invalid"),
    ({"dataset": "clinic", "engine": "probe", "kind": "count", "params": {"epsilon": -1}}, "request.invalid"),
    ({"dataset": "clinic", "engine": "probe", "kind": "count", "params": [1, 2]}, "request.invalid"),
    ({"dataset": "elsewhere", "engine": "probe", "kind": "count", "params": {"epsilon": 0.1}}, "request.invalid"),
    ({"engine": "probe", "kind": "count"}, "request.invalid"),
])
def test_it_refuses_bad_requests_and_charges_nothing(api, analyst, clinic, payload, code):
    r = api(analyst).post(URL, payload, format="json")
    assert r.status_code == 400 and r.json()["code"] == code, r.content
    assert not Request.objects.exists() and not LedgerEntry.objects.exists()


def test_an_analyst_without_a_grant_cannot_request(api, outsider, clinic):
    r = post(api(outsider), {"epsilon": 0.1})
    assert r.status_code == 400 and not LedgerEntry.objects.exists()


def test_a_revoked_grant_or_a_draft_dataset_counts_at_the_next_post(api, analyst, officer, clinic):
    from django.utils import timezone

    from governance.models import Dataset, Grant

    client = api(analyst)
    assert post(client, {"epsilon": 0.1}).status_code == 202
    Grant.objects.filter(analyst=analyst, dataset=clinic).update(revoked_at=timezone.now())
    r = post(client, {"epsilon": 0.1})
    assert r.status_code == 400 and r.json()["errors"] == {"dataset": "not found"}
    Grant.objects.filter(analyst=analyst, dataset=clinic).update(revoked_at=None)
    Dataset.objects.filter(pk=clinic.pk).update(status=Dataset.Status.DRAFT)
    assert post(client, {"epsilon": 0.1}).status_code == 400
    # an officer needs no grant and sees the dataset: the gate says why not
    assert post(api(officer), {"epsilon": 0.1}).json()["code"] == "dataset.inactive"
    assert LedgerEntry.objects.count() == 1


def test_what_was_released_stays_readable_after_the_grant_is_revoked(api, analyst, clinic,
                                                                      django_capture_on_commit_callbacks):
    """docs/concepts.md: revoking stops new requests, a free replay included; a result
    already released stays the analyst's to read."""
    from django.utils import timezone

    from governance.models import Grant

    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=True):
        rid = post(client, {"epsilon": 0.1}).json()["id"]
    released = client.get(f"{URL}{rid}/").json()
    assert released["status"] == "succeeded"
    Grant.objects.filter(analyst=analyst, dataset=clinic).update(revoked_at=timezone.now())
    again = client.get(f"{URL}{rid}/")
    assert again.status_code == 200 and again.json()["result"] == released["result"]
    assert post(client, {"epsilon": 0.1}).status_code == 400  # the same question: no replay
    assert LedgerEntry.objects.count() == 1


@pytest.mark.parametrize("withdrawn", ["grant", "dataset", "account"])
def test_a_request_queued_before_a_revocation_is_not_run_and_is_refunded(api, analyst, clinic, withdrawn,
                                                                          django_capture_on_commit_callbacks):
    """A grant revoked (or the dataset, or the analyst's account, deactivated) while the
    request waits in the queue: the worker reads nothing, releases nothing to the analyst
    and refunds the reservation."""
    from django.utils import timezone

    from governance.models import AuditRecord, Dataset, Grant

    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        rid = post(client, {"epsilon": 0.5}).json()["id"]
    if withdrawn == "grant":
        Grant.objects.filter(analyst=analyst, dataset=clinic).update(revoked_at=timezone.now())
    elif withdrawn == "dataset":
        Dataset.objects.filter(pk=clinic.pk).update(status=Dataset.Status.DRAFT)
    else:
        type(analyst).objects.filter(pk=analyst.pk).update(is_active=False)
    for callback in callbacks:  # the task arrives after the revocation
        callback()
    req = Request.objects.get(pk=rid)
    assert req.status == "cancelled" and req.result is None and not req.data_read
    assert req.error["code"] == {"grant": "grant.missing", "dataset": "dataset.inactive",
                                 "account": "account.inactive"}[withdrawn]
    assert "refunded" in req.error["detail"]
    assert LedgerEntry.objects.get().status == "released"
    assert AuditRecord.objects.filter(outcome="cancelled").count() == 1

@pytest.mark.parametrize("withdrawn", ["grant", "dataset"])
def test_a_request_queued_before_a_revocation_stays_cancelled_when_it_is_undone(
        api, analyst, officer, clinic, withdrawn, django_capture_on_commit_callbacks):
    """A probe revoked a grant (or took the dataset out of service) and gave it back before
    a worker reached the requests queued before: 211 of them ran and were released. They
    are cancelled and refunded in the revocation's transaction; what is admitted after the
    grant is given back runs."""
    from governance.models import AuditRecord, Grant

    client, officer_client = api(analyst), api(officer)
    with django_capture_on_commit_callbacks(execute=False) as before:
        rid = post(client, {"epsilon": 0.5}).json()["id"]
    if withdrawn == "grant":
        gid = Grant.objects.get(analyst=analyst, dataset=clinic).pk
        assert officer_client.delete(f"/api/grants/{gid}/").status_code == 204
    else:
        assert officer_client.post(f"/api/datasets/{clinic.name}/deactivate/").status_code == 200
    req = Request.objects.get(pk=rid)  # at once, not at the worker's claim
    code = {"grant": "grant.missing", "dataset": "dataset.inactive"}[withdrawn]
    assert (req.status, req.error["code"], req.ledger_entry.status) == ("cancelled", code, "released")
    if withdrawn == "grant":
        r = officer_client.post("/api/grants/", {"analyst": analyst.username, "dataset": clinic.name}, format="json")
        assert r.status_code == 201, r.json()
    else:
        assert officer_client.post(f"/api/datasets/{clinic.name}/activate/").status_code == 200
    for callback in before:  # the worker reaches it after the grant or the dataset is back
        callback()
    req.refresh_from_db()
    assert (req.status, req.result, req.data_read, req.ledger_entry.status) == ("cancelled", None, False, "released")
    assert AuditRecord.objects.filter(request_id=rid).values_list("action", "outcome", "reason").get() == (
        "release", "cancelled", code)
    with django_capture_on_commit_callbacks(execute=True):
        after = post(client, {"epsilon": 0.25}).json()["id"]
    assert Request.objects.get(pk=after).status == "succeeded"
    assert verification.verify().ok


@pytest.mark.parametrize("setting,params,code", [
    ("allow_non_private", {"non_private": True}, "budget.non_private"),
    ("pld_certification", {"accountant": "pld"}, "dataset.pld_not_allowed")])
def test_a_request_queued_before_the_officer_turns_its_setting_off_is_not_run(
        api, analyst, officer, clinic, setting, params, code, django_capture_on_commit_callbacks):
    """A probe found a DP-SGD sweep queued with its non-private baseline released after the
    officer turned allow_non_private off (a new one was refused), and a PLD-certified run
    after pld_certification was: what the admission relied on is checked again at the claim."""
    from governance.models import AuditRecord

    assert api(officer).patch(f"/api/datasets/{clinic.name}/", {setting: True}, format="json").status_code == 200
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        queued = post(client, {"epsilon": 0.2, **params}).json()["id"]
        other = post(client, {"epsilon": 0.1}).json()["id"]  # relies on neither setting
    assert api(officer).patch(f"/api/datasets/{clinic.name}/", {setting: False}, format="json").status_code == 200
    for callback in callbacks:
        callback()
    req = Request.objects.get(pk=queued)
    assert (req.status, req.error["code"], req.result, req.data_read) == ("cancelled", code, None, False)
    assert setting in req.error["detail"] and "refunded" in req.error["detail"]
    assert req.ledger_entry.status == "released"
    assert Request.objects.get(pk=other).status == "succeeded"
    assert AuditRecord.objects.filter(outcome="cancelled").count() == 1


@pytest.mark.parametrize("order", ["as queued", "last first"])
def test_a_cap_lowered_below_what_is_reserved_stops_the_queued_requests_past_it(
        api, analyst, officer, clinic, django_capture_on_commit_callbacks, order):
    """A probe lowered an analyst's cap to 0.05 while her requests of 0.3 and 0.25 waited:
    both released, 1.47 spent under a cap of 0.05. Lowering a cap stays allowed (it stops
    her next requests); at the claim, a queued request is cancelled and refunded when what
    is spent and reserved ahead of it (its own included) is past the cap: the ones queued
    last. (Judged against every reservation, the first was refused and the one past the
    cap ran: another probe's three requests.) Claimed out of order, the same ones run."""
    from governance.models import Grant

    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        first = post(client, {"epsilon": 0.3}).json()["id"]
        second = post(client, {"epsilon": 0.15}).json()["id"]
        third = post(client, {"epsilon": 0.25}).json()["id"]
    gid = Grant.objects.get(analyst=analyst, dataset=clinic).pk
    assert api(officer).patch(f"/api/grants/{gid}/", {"cap_epsilon": 0.5}, format="json").status_code == 200
    for callback in (callbacks if order == "as queued" else callbacks[::-1]):
        callback()
    assert Request.objects.get(pk=first).status == "succeeded"
    assert Request.objects.get(pk=second).status == "succeeded"  # 0.3 + 0.15 ahead of it fit under 0.5
    req = Request.objects.get(pk=third)
    assert (req.status, req.error["code"], req.data_read) == ("cancelled", "budget.exceeded", False)
    assert "cap" in req.error["detail"] and req.ledger_entry.status == "released"
    spent = api(analyst).get(f"/api/grants/{gid}/").json()["spent"]
    assert spent["basic"]["epsilon"] == pytest.approx(0.45)


def test_a_task_delivered_twice_changes_nothing(api, analyst, clinic, django_capture_on_commit_callbacks):
    from governance.requests.execution import execute

    with django_capture_on_commit_callbacks(execute=True):
        rid = post(api(analyst), {"epsilon": 0.3}).json()["id"]
    before = (Request.objects.get(pk=rid).finished_at, LedgerEntry.objects.get().committed_at)
    assert execute(rid) == "succeeded"
    assert (Request.objects.get(pk=rid).finished_at, LedgerEntry.objects.get().committed_at) == before


def test_a_results_disk_under_its_free_minimum_is_a_refund_before_the_read(api, analyst, clinic, settings,
                                                                           django_capture_on_commit_callbacks):
    """The real check (``result_files.check_writable`` on the scratch directory), not a
    stand-in: a scratch directory is kept between runs and creating one succeeds on a full
    disk, so a full disk was found after the read (a model trained, then not written) and
    charged. RESULTS_MIN_FREE_MB past any disk makes every disk "full"."""
    with django_capture_on_commit_callbacks(execute=True):
        post(api(analyst), {"epsilon": 0.1}, kind="file")  # the scratch directory exists from here on
    settings.RESULTS_MIN_FREE_MB = 2**40
    with django_capture_on_commit_callbacks(execute=True):
        rid = post(api(analyst), {"epsilon": 0.2}, kind="file").json()["id"]
    req = Request.objects.get(pk=rid)
    assert (req.status, req.error["code"], req.data_read) == ("failed", "request.failed_before_read", False)
    assert "RESULTS_MIN_FREE_MB" in req.error["detail"] and req.ledger_entry.status == "released"


def test_files_kept_by_a_run_whose_outcome_is_not_written_are_removed(api, analyst, clinic, monkeypatch,
                                                                      django_capture_on_commit_callbacks):
    """A run paused (SIGSTOP, a long GC pause, a frozen VM) past REQUEST_LOST_AFTER_SECONDS:
    the sweep finishes the request as lost; the run resumes, keeps its files and finds its
    outcome dropped. Its files (a model trained on the rows) are no release's: removed. So
    are those of a run killed between keeping its files and writing its outcome (the sweep)."""
    from django.db.models import Q
    from django.utils import timezone

    from governance.requests import execution, recovery
    from governance.requests.result_files import results_dir

    real = execution._keep_files

    def swept_meanwhile(req, *args):
        assert recovery._finish_lost(req.pk, Q(), timezone.now())  # the sweep, while the run was paused
        kept = real(req, *args)  # the run resumes: its files kept, its outcome next
        assert results_dir(req.pk).is_dir()
        return kept

    monkeypatch.setattr(execution, "_keep_files", swept_meanwhile)
    with django_capture_on_commit_callbacks(execute=True):
        rid = post(api(analyst), {"epsilon": 0.2}, kind="file").json()["id"]
    req = Request.objects.get(pk=rid)
    assert (req.status, req.error["code"]) == ("failed", "request.worker_lost") and not results_dir(rid).exists()
    assert req.ledger_entry.status == "committed"  # the data was read: the lost run's charge stands

    def killed_before_its_outcome(req, *args):
        kept = real(req, *args)
        assert recovery._finish_lost(req.pk, Q(), timezone.now())  # the sweep, the run gone
        assert not results_dir(req.pk).exists()
        return kept

    monkeypatch.setattr(execution, "_keep_files", killed_before_its_outcome)
    with django_capture_on_commit_callbacks(execute=True):
        rid = post(api(analyst), {"epsilon": 0.1}, kind="file").json()["id"]
    assert Request.objects.get(pk=rid).status == "failed"

    monkeypatch.setattr(execution, "_keep_files", real)
    with django_capture_on_commit_callbacks(execute=True):
        ok = post(api(analyst), {"epsilon": 0.1}, kind="file").json()["id"]
    assert Request.objects.get(pk=ok).status == "succeeded" and (results_dir(ok) / "rows.txt").read_text() == "200"


def test_a_failure_on_a_disk_that_filled_during_the_run_says_the_storage_is_full(
        api, analyst, clinic, monkeypatch, settings, django_capture_on_commit_callbacks):
    """torch.save on a full disk raises RuntimeError, not ENOSPC: the disk itself says it is
    full (under RESULTS_MIN_FREE_MB now), and that is what the analyst is told."""
    from governance.requests import execution

    def fills_the_disk(*args, **kwargs):
        settings.RESULTS_MIN_FREE_MB = 2**40  # the disk is full by the time the model is saved
        raise RuntimeError("[enforce fail at inline_container.cc:595] . PytorchStreamWriter failed writing file")

    monkeypatch.setattr(execution.plugins, "run", fills_the_disk)
    with django_capture_on_commit_callbacks(execute=True):
        rid = post(api(analyst), {"epsilon": 0.2}).json()["id"]
    req = Request.objects.get(pk=rid)
    assert (req.status, req.error["code"]) == ("failed", "request.failed_after_read")
    assert "storage is full" in req.error["detail"] and "enforce" not in req.error["detail"]


def test_a_result_that_is_not_strict_json_fails_after_the_read_charged_not_lost(
        api, analyst, clinic, django_capture_on_commit_callbacks):
    """A NaN or an infinity in an engine's result: the outcome could not be written (the
    JSON column refused it), the request stayed running until the sweep called its worker
    lost, charged in full, nothing said. Now the engine's failure after the read."""
    from governance.audit import verification

    with django_capture_on_commit_callbacks(execute=True):
        rid = post(api(analyst), {"epsilon": 0.25}, kind="nan").json()["id"]
    req = Request.objects.get(pk=rid)
    assert (req.status, req.error["code"], req.data_read) == ("failed", "request.failed_after_read", True)
    assert req.ledger_entry.status == "committed" and req.result is None
    assert verification.verify(None).ok


def test_a_run_stopped_by_the_time_limit_is_said_so_and_charged_the_work_it_names(
        api, analyst, clinic, monkeypatch, django_capture_on_commit_callbacks):
    """A DP-SGD run stopped by the soft time limit names the steps it took, as a cancelled
    one does; they were thrown away (the whole reservation committed) and the analyst read
    'the engine failed'."""
    from celery.exceptions import SoftTimeLimitExceeded

    from engines import plugins

    def stopped(engine, request, dataset, data, plan, progress, workdir=None):
        e = SoftTimeLimitExceeded()
        e.actual_event = {"kind": "laplace", "epsilon": 0.1}  # of the 0.4 planned
        raise e

    monkeypatch.setattr(plugins, "run", stopped)
    with django_capture_on_commit_callbacks(execute=True):
        rid = post(api(analyst), {"epsilon": 0.4}).json()["id"]
    req = Request.objects.get(pk=rid)
    assert (req.status, req.error["code"]) == ("failed", "request.time_limit") and "TIME_LIMIT" in req.error["detail"]
    entry = req.ledger_entry
    assert entry.status == "committed" and entry.committed_event == {"kind": "laplace", "epsilon": 0.1}


def test_a_request_task_carries_no_time_limit_so_the_worker_s_own_apply(monkeypatch):
    """Celery stamps the sender's CELERY_TASK_*_TIME_LIMIT into each message, and a worker
    obeys the message's: limits set on the workers (not the web process) never fired."""
    from workers import app
    from workers.tasks import run_request

    sent = {}
    monkeypatch.setattr(type(app), "send_task", lambda self, name, *a, **kw: sent.update(kw, name=name))
    eager, app.conf.task_always_eager = app.conf.task_always_eager, False
    try:
        run_request.apply_async(args=["00000000-0000-0000-0000-000000000000"], queue="cpu")
    finally:
        app.conf.task_always_eager = eager
    assert sent["name"] == "workers.run_request"
    assert sent["time_limit"] is None and sent["soft_time_limit"] is None


def test_a_cancel_asked_after_the_engine_s_last_report_cancels_the_run(api, analyst, clinic, monkeypatch, settings,
                                                                      django_capture_on_commit_callbacks):
    """A cancel answered 200 during a synthesis's reports: its last two reports had gone,
    the run ended succeeded and its table was released (probe AF). Now it is cancelled,
    charged the work done, and its files are not kept."""
    from engines import plugins

    real = plugins.run

    def then_cancelled(engine, request, *args, **kwargs):
        release = real(engine, request, *args, **kwargs)
        Request.objects.filter(engine=engine).update(cancel_requested=True)  # asked as it finished
        return release

    monkeypatch.setattr(plugins, "run", then_cancelled)
    with django_capture_on_commit_callbacks(execute=True):
        rid = post(api(analyst), {"epsilon": 0.1}, kind="file").json()["id"]
    req = Request.objects.get(pk=rid)
    assert (req.status, req.error["code"], req.result) == ("cancelled", "request.cancelled", None)
    assert req.ledger_entry.status == "committed"
    assert not (settings.RESULTS_DIR / str(rid)).exists()


def test_a_heartbeat_tick_notices_a_cancel_asked_during_a_phase_without_reports(api, analyst, clinic, monkeypatch):
    """MST's fit sends no report for 10-13 s: the cancel was seen only at the report after
    the next one. A heartbeat tick now marks the run cancelled (raised at the next report)
    and still beats (the sweep must not take a cancelled run's worker for lost)."""
    from governance.requests import execution, submission

    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: None)
    rid = post(api(analyst), {"epsilon": 0.1}).json()["id"]
    Request.objects.filter(pk=rid).update(status="running", cancel_requested=True)
    clock = execution.RunClock(rid, 0)
    clock._tick_write(None)
    assert clock.cancelled and Request.objects.get(pk=rid).heartbeat_at is not None
    with pytest.raises(execution.Cancelled):
        clock.report({"phase": "sampling", "fraction": 0.9})


def test_a_huge_float_parameter_is_one_number_on_every_database(api, analyst, clinic,
                                                                 django_capture_on_commit_callbacks):
    """A count WHERE age < 1.5e300: SQLite kept the float, PostgreSQL's jsonb gave back the
    decimal 15 x 10^299, and the commit's audit record (read from the request's row) held
    that other integer on PostgreSQL only (a probe). Stored as the int the float equals,
    before anything: the request, its fingerprint and every record agree on both."""
    from governance.models import AuditRecord

    client = api(analyst)
    where = [{"column": "age", "op": "<", "value": 1.5e300}]
    with django_capture_on_commit_callbacks(execute=True):
        r = client.post(URL, {"dataset": "clinic", "engine": "aggregates", "kind": "count",
                              "params": {"epsilon": 0.1, "where": where}}, format="json")
    assert r.status_code == 202, r.content
    body = client.get(f"{URL}{r.json()['id']}/").json()
    assert body["status"] == "succeeded", body
    stored = body["params"]["where"][0]["value"]
    assert type(stored) is int and stored == int(1.5e300)
    record = AuditRecord.objects.get(action="commit", request_id=r.json()["id"])
    assert record.params["where"][0]["value"] == stored
    with django_capture_on_commit_callbacks(execute=True):
        again = client.post(URL, {"dataset": "clinic", "engine": "aggregates", "kind": "count",
                                  "params": {"epsilon": 0.1, "where": where}}, format="json")
    assert again.json()["replayed"] is True  # the same question, whatever the number's form
