"""Every error code the API can return, provoked through the client against a live server:
the client raises the typed error carrying the code, the HTTP status and the numbers.

``test_every_code_of_the_service_is_covered_here`` reads the codes out of the service's
source (governance/core/errors.py, governance/api/errors.py, the engines' errors and a
request's ``error.code`` values) and fails when one has no case below.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

import privacy_client as pc
from governance.models import LedgerEntry, Request
from privacy_client.errors import ERRORS, error_for
from tests.requests.conftest import probe_engine  # noqa: F401 - a fixture: an engine whose "fail" kind fails after reading

from .conftest import make_client

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]


def raises(cls, code, status):
    """pytest.raises for ``cls`` that also checks the code and status."""

    class Check:
        def __enter__(self):
            self.ctx = pytest.raises(cls)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            out = self.ctx.__exit__(*exc)
            err = self.info.value
            assert err.code == code, (err.code, err.body)
            assert err.status == status, (err.status, err.body)
            assert type(err) is ERRORS.get(code, type(err)), type(err)
            assert str(err).startswith(f"[{code}]")
            return out
    return Check()


def test_request_invalid_carries_the_fields(server):
    with raises(pc.InvalidRequest, "request.invalid", 400) as e:
        server.analyst.run("clinic", "mean", column="weight", epsilon=-1)
    assert set(e.value.errors) >= {"column", "epsilon"}
    assert not LedgerEntry.objects.exists()


def test_request_malformed(server):
    with raises(pc.InvalidRequest, "request.malformed", 400):
        server.analyst.call("POST", "/api/requests/", data=b'{"dataset": ', headers={"Content-Type": "application/json"})


def test_event_invalid_carries_the_path(server):
    with raises(pc.InvalidRequest, "event.invalid", 400) as e:
        server.analyst.estimate_events("clinic", {"kind": "laplace", "epsilon": -2})
    assert "path" in e.value.body


def test_dataset_invalid(server):
    with raises(pc.InvalidRequest, "dataset.invalid", 400):
        server.officer.call("POST", "/api/datasets/", json={"name": "clinic", "path": "/nowhere.csv",
                                                            "budget_epsilon": 1.0})


def test_engine_unknown(server):
    with raises(pc.InvalidRequest, "engine.unknown", 400):
        server.analyst.run("clinic", "count", engine="no-such-engine", epsilon=0.1)


def test_sql_invalid_and_unsupported_name_the_part(server):
    with raises(pc.SqlError, "sql.invalid", 400) as e:
        server.analyst.sql("SELECT COUNT(*) FROM clinic WHERE", epsilon=0.1)
    assert e.value.part == "syntax"
    with raises(pc.SqlUnsupported, "sql.unsupported", 400) as e:
        server.analyst.sql("SELECT COUNT(*) FROM clinic JOIN other ON clinic.age = other.age", epsilon=0.1)
    assert e.value.part == "JOIN" and isinstance(e.value, pc.InvalidRequest)
    with raises(pc.SqlUnsupported, "sql.unsupported", 400) as e:
        server.analyst.estimate_sql("SELECT STDDEV(age) FROM clinic", epsilon=0.1)
    assert e.value.part == "STDDEV"


def test_auth_required_and_failed(server):
    with raises(pc.AuthenticationError, "auth.required", 401):
        make_client(server.url, None).datasets()
    with raises(pc.AuthenticationError, "auth.failed", 401):
        make_client(server.url, "not-a-token").datasets()


def test_permission_denied(server):
    with raises(pc.PermissionDenied, "permission.denied", 403):
        server.analyst.call("GET", "/api/analysts/")


def test_grant_missing_when_the_grant_goes_between_the_check_and_the_gate(server, monkeypatch):
    """The visibility check hides ungranted datasets, so the gate's own refusal shows only
    when a grant is revoked between the two: widen the check to stand for that race."""
    from governance.api import request_views
    from governance.models import Dataset

    monkeypatch.setattr(request_views, "usable_dataset", lambda user, name: Dataset.objects.filter(name=name).first())
    with raises(pc.PermissionDenied, "grant.missing", 403) as e:
        server.outsider.run("clinic", "count", epsilon=0.1)
    assert e.value.dataset == "clinic"


def test_not_found(server):
    with raises(pc.NotFound, "not_found", 404):
        server.outsider.dataset("clinic")  # exists, but not for bob: the same answer as a missing one
    with raises(pc.NotFound, "not_found", 404):
        server.analyst.request("00000000-0000-0000-0000-000000000000")


def test_method_not_allowed_and_not_acceptable(server):
    with raises(pc.InvalidRequest, "method.not_allowed", 405):
        server.analyst.call("DELETE", "/api/me/")
    with raises(pc.InvalidRequest, "request.not_acceptable", 406):
        server.analyst.call("GET", "/api/me/", headers={"Accept": "application/x-no-such-type"})


def test_budget_exceeded_carries_what_remains(server):
    server.analyst.run("clinic", "count", epsilon=5.0)
    with raises(pc.BudgetExceeded, "budget.exceeded", 409) as e:
        server.analyst.run("clinic", "count", epsilon=50.0)
    err = e.value
    assert err.scope == "dataset" and err.policy == "rdp"
    assert err.remaining_epsilon == pytest.approx(15.0, abs=1e-2) and err.spent_epsilon > 4.9
    assert err.would_cost_epsilon == pytest.approx(50.0, abs=1e-2) and err.would_total_epsilon > 50
    assert LedgerEntry.objects.count() == 1


def test_budget_exceeded_by_a_grant_cap(server, officer):
    from governance.models import Grant

    Grant.objects.filter(dataset__name="clinic").update(cap_epsilon=1.0)
    assert not server.analyst.estimate("clinic", "count", epsilon=2.0).would_admit  # an estimate says, not raises
    with raises(pc.BudgetExceeded, "budget.exceeded", 409) as e:
        server.analyst.run("clinic", "count", epsilon=2.0)
    assert e.value.scope == "grant" and e.value.remaining_epsilon == pytest.approx(1.0)


def test_budget_non_private(server):
    with raises(pc.Conflict, "budget.non_private", 409):
        server.officer.call("POST", "/api/datasets/clinic/charges/", json={"event": {"kind": "non_private"}})


def test_dataset_inactive(server, make_dataset):
    make_dataset("draft", activate=False)
    with raises(pc.Conflict, "dataset.inactive", 409):
        server.officer.run("draft", "count", epsilon=0.1)


def test_ledger_conflict_on_cancelling_a_finished_request(server):
    done = server.analyst.run("clinic", "count", epsilon=0.1)
    with raises(pc.Conflict, "ledger.conflict", 409) as e:
        server.analyst.cancel(done)
    assert e.value.status_now == "succeeded"


def test_idempotency_key_reused(server):
    server.analyst.submit("clinic", "count", epsilon=0.1, idempotency_key="key-1")
    with raises(pc.IdempotencyKeyReused, "idempotency.key_reused", 422):
        server.analyst.submit("clinic", "count", epsilon=0.2, idempotency_key="key-1")


def test_rate_limited_carries_retry_after(server, settings):
    from django.core.cache import cache

    cache.clear()
    settings.REQUEST_RATE_LIMIT = "2/min"
    server.analyst.submit("clinic", "count", epsilon=0.01)
    server.analyst.submit("clinic", "count", epsilon=0.02)
    with raises(pc.RateLimited, "rate.limited", 429) as e:
        server.analyst.submit("clinic", "count", epsilon=0.03)
    assert 0 < e.value.retry_after <= 60
    cache.clear()


def test_too_many_active_is_rate_limited_with_retry_after(server, settings, monkeypatch):
    from governance.requests import submission

    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: None)  # they stay queued
    settings.MAX_ACTIVE_REQUESTS = 1
    server.analyst.submit("clinic", "count", epsilon=0.01)
    with raises(pc.RateLimited, "request.too_many_active", 429) as e:
        server.analyst.submit("clinic", "count", epsilon=0.02)
    assert e.value.retry_after == 10 and e.value.body["max_active"] == 1


def test_request_too_large(server, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1_000
    with raises(pc.RequestTooLarge, "request.too_large", 413):
        server.analyst.sql("SELECT COUNT(*) FROM clinic WHERE site IN (" + ", ".join(["'north'"] * 300) + ")",
                           epsilon=0.1)


def test_request_too_costly(server):
    events = [{"kind": "subsampled_gaussian", "sample_rate": 0.01 + i * 1e-5, "noise_multiplier": 1.1, "steps": 100}
              for i in range(2_000)]  # distinct curves: more than a CPU second of work
    with raises(pc.InvalidRequest, "request.too_costly", 400):
        server.analyst.estimate_events("clinic", events)


def test_unsupported_media_type(server):
    with raises(pc.UnsupportedMediaType, "request.unsupported_media_type", 415):
        server.analyst.call("POST", "/api/requests/", data="dataset=clinic", headers={"Content-Type": "text/plain"})


# ---- a request's own error.code: raised by run()/wait() as RequestFailed, with the request


def test_failed_before_read_is_refunded(server, settings):
    for path in settings.DATA_DIR.rglob("*"):  # the stored table is gone before the run reads it
        if path.is_file():
            path.unlink()
    with raises(pc.RequestFailed, "request.failed_before_read", 200) as e:
        server.analyst.run("clinic", "count", epsilon=0.5)
    assert e.value.request["status"] == "failed" and e.value.request["charge"]["ledger_status"] == "released"


def test_failed_after_read_keeps_the_charge(server, probe_engine):  # noqa: F811
    with raises(pc.RequestFailed, "request.failed_after_read", 200) as e:
        server.analyst.run("clinic", "fail", engine="probe", epsilon=0.5)
    assert e.value.request["charge"]["ledger_status"] == "committed"
    assert "secret" not in str(e.value)  # the failure's message could quote the data: never shown


def test_cancelled(server, monkeypatch):
    from governance.requests import submission

    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: None)  # stays queued
    queued = server.analyst.submit("clinic", "count", epsilon=0.5)
    server.analyst.cancel(queued.id)
    with raises(pc.RequestFailed, "request.cancelled", 200):
        server.analyst.wait(queued.id)


def test_worker_lost(server, monkeypatch):
    from governance.requests import recovery, submission

    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: None)
    queued = server.analyst.submit("clinic", "count", epsilon=0.5)
    long_ago = timezone.now() - timedelta(hours=1)
    Request.objects.filter(pk=queued.id).update(status=Request.Status.RUNNING, started_at=long_ago,
                                                heartbeat_at=long_ago, data_read=True)
    assert recovery.sweep()["lost"] == [queued.id]
    with raises(pc.RequestFailed, "request.worker_lost", 200) as e:
        server.analyst.wait(queued.id)
    assert e.value.request["charge"]["ledger_status"] == "committed"


def test_restored(server, monkeypatch):
    from django.core.management import call_command

    from governance.requests import submission

    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: None)
    queued = server.analyst.submit("clinic", "count", epsilon=0.5)
    call_command("recover", "--restored")
    with raises(pc.RequestFailed, "request.restored", 200) as e:
        server.analyst.wait(queued.id)
    assert e.value.request["charge"]["ledger_status"] == "committed"


def test_time_limit(server, monkeypatch):
    from celery.exceptions import SoftTimeLimitExceeded

    from engines import plugins

    def stopped(*args, **kwargs):
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(plugins, "run", stopped)
    with raises(pc.RequestFailed, "request.time_limit", 200) as e:
        server.analyst.run("clinic", "count", epsilon=0.5)
    assert e.value.request["charge"]["ledger_status"] == "committed"


def test_wait_timeout_leaves_the_request_going(server, monkeypatch):
    from governance.requests import submission

    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: None)
    queued = server.analyst.submit("clinic", "count", epsilon=0.5)
    with pytest.raises(pc.WaitTimeout) as e:
        server.analyst.wait(queued, timeout=0.3)
    assert e.value.request_id == queued.id and e.value.status == "queued"


# ---- codes only a race or a bug produces: the client's mapping, without a server


MAPPING_CASES = [
    (409, {"code": "conflict", "detail": "This conflicts with a concurrent change; reload and retry."},
     pc.Conflict, "conflict"),
    (500, {"code": "error", "detail": "boom"}, pc.ServerError, "error"),
    (502, "<html>Bad gateway</html>", pc.ServerError, "error"),
    (418, {"code": "some.new_code", "detail": "x", "limit": 3}, pc.ApiError, "some.new_code"),
    (400, {"code": "dataset.partition_invalid", "detail": "x"}, pc.InvalidRequest, "dataset.partition_invalid"),
    # an officer's PATCH of a revoked grant (the client has no grant calls): tests/api/test_grants.py
    (409, {"code": "grant.revoked", "detail": "x"}, pc.Conflict, "grant.revoked"),
    # a queued request's error when its analyst was deactivated meanwhile (she cannot sign in
    # to read it): tests/requests/test_requests_api.py makes the service write it
    (403, {"code": "account.inactive", "detail": "x"}, pc.PermissionDenied, "account.inactive"),
    # a Dask cluster out of reach while a distributed dataset is registered:
    # tests/distributed/test_distributed_api.py makes the service answer it
    (503, {"code": "cluster.unavailable", "detail": "x", "retry_after": 30}, pc.ServerError, "cluster.unavailable"),
    # a queued request's error when its officer turned pld_certification off meanwhile
    (409, {"code": "dataset.pld_not_allowed", "detail": "x"}, pc.Conflict, "dataset.pld_not_allowed"),
    # a full disk: tests/hostile/test_uploads.py makes the service answer it
    (507, {"code": "storage.full", "detail": "x"}, pc.ServerError, "storage.full"),
    # a read-only data directory: tests/hostile/test_uploads.py makes the service answer it
    (503, {"code": "storage.unwritable", "detail": "x"}, pc.ServerError, "storage.unwritable"),
    # a locked or unreachable database: tests/hostile/test_edges.py makes the service answer it
    (503, {"code": "database.unavailable", "detail": "x", "retry_after": 5}, pc.ServerError, "database.unavailable"),
]


@pytest.mark.parametrize("status,body,cls,code", MAPPING_CASES)
def test_codes_without_a_live_path_map_to_their_types(status, body, cls, code):
    err = error_for(status, body)
    assert type(err) is cls and err.code == code and err.status == status
    if isinstance(body, dict) and "limit" in body:
        assert err.limit == 3  # unknown numbers are attributes too


RACE_OR_BUG_ONLY = {"conflict", "error", "dataset.partition_invalid", "engine.error"}


def test_every_code_of_the_service_is_covered_here():
    sources = ["governance/core/errors.py", "governance/api/errors.py", "governance/api/parsers.py",
               "governance/requests/execution.py", "governance/requests/recovery.py", "governance/requests/submission.py",
               "engines/types.py", "accounting/events.py"]
    text = "\n".join((ROOT / p).read_text() for p in sources if (ROOT / p).exists())
    codes = set(re.findall(r'(?:code = |"code": |: )"([a-z_]+(?:\.[a-z_]+)*)"', text))
    codes = {c for c in codes if "." in c or c in ("not_found", "conflict", "error")}
    assert {"budget.exceeded", "request.worker_lost", "auth.required"} <= codes  # the reading works
    # the cases of this file: each raises(...) block above, and the mapping cases
    covered = set(re.findall(r'raises\(pc\.\w+, "([^"]+)"', Path(__file__).read_text()))
    covered |= {case[3] for case in MAPPING_CASES}
    missing = codes - covered - RACE_OR_BUG_ONLY
    assert not missing, f"codes the API can return without a client test: {sorted(missing)}"
    assert codes <= set(ERRORS) | {"error"}, sorted(codes - set(ERRORS))
