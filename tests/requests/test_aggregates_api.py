"""The DP aggregates engine through the REST API (Celery eager): real answers, and every
bad input the issue names refused with a 400 and nothing charged."""

import pytest

from governance.models import LedgerEntry, Request

pytestmark = pytest.mark.django_db
URL = "/api/requests/"


@pytest.fixture
def clinic(make_dataset, analyst, grant):
    ds = make_dataset(epsilon=10.0, unit_column="patient_id", schema={
        "age": {"lower": 18, "upper": 90}, "income": {"lower": 0, "upper": 200_000},
        "site": {"type": "categorical", "domain": ["north", "south", "east", "west"]}})
    grant(analyst, ds)
    return ds


def ask(client, kind, params):
    return client.post(URL, {"dataset": "clinic", "engine": "aggregates", "kind": kind, "params": params},
                       format="json")


def test_it_answers_a_grouped_count_over_exactly_the_declared_domain(api, analyst, clinic,
                                                                     django_capture_on_commit_callbacks):
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=True):
        r = ask(client, "count", {"group_by": "site", "epsilon": 5.0, "max_rows_per_unit": 10})
    assert r.status_code == 202, r.content
    body = client.get(f"{URL}{r.json()['id']}/").json()
    assert body["status"] == "succeeded", body
    keys = [g["key"] for g in body["result"]["groups"]]
    assert keys == ["north", "south", "east", "west"]  # "west" is declared but absent: still listed
    assert body["charge"]["basic"]["epsilon"] == pytest.approx(5.0, rel=1e-6)
    for g in body["result"]["groups"]:
        lo, hi = g["ci95"]
        assert lo <= g["value"] <= hi


@pytest.mark.parametrize("kind", ["mean", "variance"])
def test_a_mean_and_a_variance_are_right_on_every_database(api, analyst, make_dataset, grant,
                                                           django_capture_on_commit_callbacks, kind):
    """The plan travels through the database: on PostgreSQL its JSON comes back with keys
    in jsonb's order ("sum" before "count"), which once made every mean "midpoint + count"."""
    from tests.conftest import small_frame

    frame = small_frame(n=2000, seed=5)
    ds = make_dataset("wide", epsilon=1e6, frame=frame)
    grant(analyst, ds)
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=True):
        r = client.post(URL, {"dataset": "wide", "engine": "aggregates", "kind": kind,
                              "params": {"column": "income", "epsilon": 1e5}}, format="json")
    assert r.status_code == 202, r.content
    body = client.get(f"{URL}{r.json()['id']}/").json()
    assert body["status"] == "succeeded", body
    truth = frame["income"].clip(0, 200_000)
    expected = truth.mean() if kind == "mean" else truth.var(ddof=0)
    assert body["result"]["value"] == pytest.approx(expected, rel=0.01)


def test_it_lists_the_engines_with_their_parameter_schemas(api, analyst):
    engines = {e["name"]: e for e in api(analyst).get("/api/engines/").json()["results"]}
    assert set(engines["aggregates"]["kinds"]) == {"count", "sum", "mean", "variance", "histogram", "quantile", "query"}
    assert engines["aggregates"]["queue"] == "cpu"


@pytest.mark.parametrize("kind,params,field", [
    ("sum", {"column": "weight", "epsilon": 1.0}, "column"),                                   # unknown column
    ("count", {"where": [{"column": "patient_id", "op": "==", "value": 3}], "epsilon": 1.0}, "where"),  # undeclared
    ("count", {"where": [{"column": "nope", "op": "==", "value": 3}], "epsilon": 1.0}, "where"),
    ("count", {"epsilon": 0}, "epsilon"),
    ("count", {"epsilon": -1.0}, "epsilon"),
    ("quantile", {"column": "age", "q": 1.5, "epsilon": 1.0}, "q"),
    ("quantile", {"column": "age", "q": 0, "epsilon": 1.0}, "q"),
    ("count", {"group_by": "income", "epsilon": 1.0}, "group_by"),                           # no declared domain
    ("mean", {"column": "site", "epsilon": 1.0}, "column"),
    ("count", {"epsilon": 1.0, "mechanism": "magic"}, "mechanism"),
])
def test_it_refuses_bad_queries_and_charges_nothing(api, analyst, clinic, kind, params, field):
    r = ask(api(analyst), kind, params)
    assert r.status_code == 400, r.content
    body = r.json()
    assert body["code"] == "request.invalid", body
    assert any(key.split("[")[0] == field for key in body["errors"]), body
    assert not Request.objects.exists() and not LedgerEntry.objects.exists()
