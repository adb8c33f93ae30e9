"""Hostile requests end to end through the REST API (Hypothesis), on a real dataset.

- Aggregates requests: plausible parameters with hostile values (predicate values that
  are NUL, lone surrogates, huge or tiny numbers, unicode; absurd budgets, bins,
  quantiles), run at once (Celery eager). Each is answered 202 (queued, then run), 200
  (a replay), 400 or 409, never a 5xx; a request that was admitted **succeeds** (a crash
  after the data is read would keep the analyst's charge for nothing) and its result
  reads back as strict JSON.
- Estimates and external charges with hostile events (extreme numbers, deep nesting,
  huge counts): 200/201, 400 or 409, never a 5xx, and the audit chain still verifies
  against the ledger afterwards (a float that did not survive the hash would break it).

``CI_EXAMPLES`` derandomized examples by default, ``FULL_EXAMPLES`` with HOSTILE_FULL=1.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from governance.models import Request

from .conftest import fuzz_settings
from .strategies import json_trees, plausible_events, plausible_params

CI_EXAMPLES = 40
FULL_EXAMPLES = 1_500
NUMERIC, CATEGORICAL = ["age", "income"], ["site"]


def post_json(client, url, body):
    """POST ``body`` as JSON text as a client could write it: lone surrogates as \\u escapes,
    NaN and Infinity as the non-standard literals (the parser must refuse both)."""
    return client.generic("POST", url, json.dumps(body).encode(), content_type="application/json")


@pytest.fixture
def analyst_client(api, analyst, make_dataset, grant, no_rate_limit):
    ds = make_dataset("clinic", epsilon=1e6, unit_column="patient_id")  # refusals for cost, not exhaustion
    grant(analyst, ds)
    client = api(analyst)
    client.raise_request_exception = False
    return client


@pytest.mark.django_db
@fuzz_settings(CI_EXAMPLES, FULL_EXAMPLES)
@given(st.one_of(*[plausible_params(NUMERIC, CATEGORICAL)] * 4,
                 st.tuples(st.sampled_from(["count", "sum", "histogram"]), json_trees())))
def test_hostile_aggregates_requests(analyst_client, django_capture_on_commit_callbacks, kind_params):
    kind, params = kind_params
    body = {"dataset": "clinic", "engine": "aggregates", "kind": kind, "params": params}
    with django_capture_on_commit_callbacks(execute=True):
        r = post_json(analyst_client, "/api/requests/", body)
    assert r.status_code in (200, 202, 400, 409), (r.status_code, r.content[:500])
    body = r.json()
    event(f"{r.status_code} {body.get('code', '')}")
    if r.status_code in (200, 202):
        req = Request.objects.get(pk=body["id"])
        assert req.status == Request.Status.SUCCEEDED, (req.status, req.error, params)
        again = analyst_client.get(f"/api/requests/{req.pk}/")
        assert again.status_code == 200
        json.loads(again.content, parse_constant=lambda c: pytest.fail(f"{c} in a result"))
    else:
        assert body["code"] and body["detail"]


@pytest.fixture
def officer_client(api, officer, make_dataset, no_rate_limit):
    make_dataset("ledgered", epsilon=50.0)
    client = api(officer)
    client.raise_request_exception = False
    return client


@pytest.mark.django_db
@fuzz_settings(CI_EXAMPLES, FULL_EXAMPLES)
@given(st.lists(plausible_events(), min_size=1, max_size=3), st.booleans())
def test_hostile_events_at_the_gate_keep_the_audit_chain_whole(officer_client, evs, as_list):
    from governance.audit import verification

    body = {"events": evs} if as_list else {"event": evs[0]}
    r = post_json(officer_client, "/api/datasets/ledgered/estimate/", body)
    assert r.status_code in (200, 400), (r.status_code, r.content[:500])
    event(f"estimate {r.status_code} {r.json().get('code', '')}")
    r = post_json(officer_client, "/api/datasets/ledgered/charges/", {"event": evs[0], "reference": "fuzz"})
    assert r.status_code in (201, 400, 409), (r.status_code, r.content[:500])
    event(f"charge {r.status_code} {r.json().get('code', '')}")
    result = verification.verify(None, stop_at_first=False).as_dict()
    assert result["ok"], result
