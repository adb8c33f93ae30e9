"""The synthesis engine through the REST API (Celery eager) on real survey data: the table,
its charge equal to the planned event, downloads, officer-only reports; nothing learnt
from the data without charge; no false correlation from the sampler; bad input refused
with a 400 and nothing charged."""

import io

import numpy as np
import pandas as pd
import pytest

from accounting import parse_event, rdp
from governance.models import LedgerEntry, Request
from tests.real_data import GSS_SCHEMA, gss_wages

pytestmark = pytest.mark.django_db
URL = "/api/requests/"


@pytest.fixture
def gss(make_dataset, analyst, grant):
    ds = make_dataset("gss", epsilon=20.0, frame=gss_wages(), schema=GSS_SCHEMA)
    grant(analyst, ds)
    return ds


def synthesize(client, params, dataset="gss"):
    return client.post(URL, {"dataset": dataset, "engine": "synthesis", "kind": "synthesize", "params": params},
                       format="json")


def run(client, params, capture, dataset="gss"):
    with capture(execute=True):
        r = synthesize(client, params, dataset)
    assert r.status_code == 202, r.content
    body = client.get(f"{URL}{r.json()['id']}/").json()
    assert body["status"] == "succeeded", body
    return body


def download(client, rid, name):
    r = client.get(f"{URL}{rid}/files/{name}/")
    assert r.status_code == 200, r
    if name.endswith(".csv"):  # (a client without the charset read a column named naïve as Latin-1)
        assert r["Content-Type"] == "text/csv; charset=utf-8", r["Content-Type"]
    return b"".join(r.streaming_content)


def test_mst_makes_a_table_charged_exactly_as_planned(api, analyst, officer, gss, django_capture_on_commit_callbacks):
    client = api(analyst)
    body = run(client, {"method": "mst", "epsilon": 1.0, "rows": 5000, "holdout_fraction": 0.2, "target": "gender"},
               django_capture_on_commit_callbacks)
    res = body["result"]
    assert res["method"] == "mst" and res["rows"] == 5000 and len(res["selected_pairs"]) == len(GSS_SCHEMA) - 1
    # The charge is the planned event, and the planned event is epsilon 1 under the RDP accountant.
    entry = LedgerEntry.objects.get(pk=Request.objects.get(pk=body["id"]).ledger_entry_id)
    assert entry.status == "committed" and entry.committed_event is None
    assert body["charge"]["rdp"]["epsilon"] == pytest.approx(entry.charge["rdp"]["epsilon"])
    assert entry.charge["rdp"]["epsilon"] == pytest.approx(1.0, rel=1e-6) and entry.charge["rdp"]["epsilon"] <= 1.0
    # composed alone, off the ledger's grid of orders, the same event costs no more
    assert rdp.compose([parse_event(body["event"])], res["delta"]).epsilon <= entry.charge["rdp"]["epsilon"]
    # Both downloads hold the same table, inside the declared bounds and domains.
    table = pd.read_parquet(io.BytesIO(download(client, body["id"], "synthetic.parquet")))
    csv = pd.read_csv(io.BytesIO(download(client, body["id"], "synthetic.csv")))
    assert list(table.columns) == list(GSS_SCHEMA) == list(csv.columns) and len(table) == len(csv) == 5000
    for name, spec in GSS_SCHEMA.items():
        col = table[name].dropna()
        if spec.get("type") == "categorical":
            assert set(col) <= set(spec["domain"])
        else:
            assert spec["lower"] <= col.min() and col.max() <= spec["upper"]
    assert table["realrinc"].nunique() > 1000  # values drawn inside their bins, not 20 bin midpoints
    # The reports compare with the private rows: the officer sees them, the analyst does not.
    assert body["officer_report"] is None and "officer" in res["reports"]
    seen = api(officer).get(f"{URL}{body['id']}/").json()
    report = seen["officer_report"]
    assert 0.8 < report["quality"]["summary"]["overall_accuracy"] <= 1
    assert {f["name"] for f in report["files"]} >= {"report.html", "quality.json", "privacy.json"}
    html = api(officer).get(f"{URL}{body['id']}/officer-files/report.html/")
    assert html.status_code == 200 and b"<img" in b"".join(html.streaming_content)
    assert client.get(f"{URL}{body['id']}/officer-files/report.html/").status_code == 403


def test_nothing_is_learnt_from_the_data_without_charge(api, analyst, make_dataset, grant,
                                                        django_capture_on_commit_callbacks):
    rng = np.random.default_rng(3)
    n = 4000
    frame = pd.DataFrame({
        "colour": rng.choice(["red", "green", "secret-value"], n),  # "secret-value" is not declared
        "size": rng.normal(50, 30, n),  # values outside the declared [0, 100]
    })
    ds = make_dataset("shop", epsilon=10.0, frame=frame, schema={
        "colour": {"type": "categorical", "domain": ["red", "green", "blue"]}, "size": {"lower": 0, "upper": 100}})
    grant(analyst, ds)
    client = api(analyst)
    body = run(client, {"epsilon": 3.0, "holdout_fraction": 0}, django_capture_on_commit_callbacks, dataset="shop")
    table = pd.read_parquet(io.BytesIO(download(client, body["id"], "synthetic.parquet")))
    assert set(table["colour"].dropna()) <= {"red", "green", "blue"}  # never a value read from the data
    assert table["size"].min() >= 0 and table["size"].max() <= 100  # the declared bounds, not the data's


def test_columns_independent_given_their_parent_stay_independent(api, analyst, make_dataset, grant,
                                                                 django_capture_on_commit_callbacks):
    """The trap of mbi 1.x's sampler: two children of one parent, filled in row order,
    came out correlated. Here A and B depend on P only; within each P they are independent."""
    rng = np.random.default_rng(7)
    n = 30_000
    p = rng.integers(0, 3, n)
    a = np.where(rng.random(n) < 0.05 + 0.45 * p, "a1", "a0")
    b = np.where(rng.random(n) < 0.95 - 0.45 * p, "b1", "b0")
    frame = pd.DataFrame({"p": np.array(["p0", "p1", "p2"])[p], "a": a, "b": b})
    ds = make_dataset("tree", epsilon=20.0, frame=frame, schema={
        "p": {"type": "categorical", "domain": ["p0", "p1", "p2"]},
        "a": {"type": "categorical", "domain": ["a0", "a1"]}, "b": {"type": "categorical", "domain": ["b0", "b1"]}})
    grant(analyst, ds)
    client = api(analyst)
    body = run(client, {"method": "mst", "epsilon": 10.0, "holdout_fraction": 0}, django_capture_on_commit_callbacks,
               dataset="tree")
    assert sorted(map(sorted, body["result"]["selected_pairs"])) == [["a", "p"], ["b", "p"]]
    syn = pd.read_parquet(io.BytesIO(download(client, body["id"], "synthetic.parquet")))
    for value, group in syn.groupby("p"):
        # Within a parent value, P(a1 and b1) = P(a1) P(b1) up to sampling error.
        pa1, pb1 = (group["a"] == "a1").mean(), (group["b"] == "b1").mean()
        joint = ((group["a"] == "a1") & (group["b"] == "b1")).mean()
        assert abs(joint - pa1 * pb1) < 0.02, (value, joint, pa1 * pb1)


@pytest.mark.parametrize("params,field", [
    ({"epsilon": 0.0005}, "epsilon"),                                   # too small for MST on this table
    ({"epsilon": 0}, "epsilon"),
    ({"epsilon": 1.0, "rows": 0}, "rows"),                              # zero rows
    ({"epsilon": 1.0, "columns": ["age", "salary"]}, "columns"),        # unknown column
    ({"epsilon": 1.0, "method": "ctgan"}, "method"),
    ({"epsilon": 1.0, "columns": ["age"]}, "columns"),                  # MST needs two columns
    ({"epsilon": 1.0, "bins": 1}, "bins"),
    ({"epsilon": 1.0, "target": "wage"}, "target"),
    ({"epsilon": 1.0, "method": "vae", "batch_size": 10_000_000}, "batch_size"),
    ({"epsilon": 1e-6, "method": "vae"}, "epsilon"),                    # too small to train one step
    ({"epsilon": 1.0, "unit_weighting": "yes"}, "unit_weighting"),      # not a boolean
    ({"epsilon": 1.0, "unit_weighting": True}, "unit_weighting"),       # gss has no privacy-unit column
])
def test_it_refuses_bad_synthesis_requests_and_charges_nothing(api, analyst, gss, params, field):
    r = synthesize(api(analyst), params)
    assert r.status_code == 400, r.content
    assert field in r.json()["errors"], r.json()
    assert not LedgerEntry.objects.exists() and not Request.objects.exists()


def test_a_numeric_column_without_declared_bounds_is_refused(api, analyst, make_dataset, grant):
    ds = make_dataset("clinic", epsilon=5.0, schema={"age": {"lower": 18, "upper": 90}})  # income: no bounds
    grant(analyst, ds)
    r = synthesize(api(analyst), {"epsilon": 1.0, "columns": ["age", "income"]}, dataset="clinic")
    assert r.status_code == 400 and "no declared bounds" in r.json()["errors"]["columns"], r.content
    assert not LedgerEntry.objects.exists()


def test_the_dp_vae_clips_per_privacy_unit_on_a_group_level_dataset(api, analyst, make_dataset, grant,
                                                                     django_capture_on_commit_callbacks):
    ds = make_dataset("clinic", epsilon=10.0, unit_column="patient_id", schema={
        "age": {"lower": 18, "upper": 90, "integer": True}, "income": {"lower": 0, "upper": 200_000},
        "site": {"type": "categorical", "domain": ["north", "south", "east"]}})
    grant(analyst, ds)
    client = api(analyst)
    body = run(client, {"method": "vae", "epsilon": 5.0, "rows": 300, "epochs": 2, "holdout_fraction": 0},
               django_capture_on_commit_callbacks, dataset="clinic")
    event = body["event"]
    assert event["kind"] == "subsampled_gaussian"
    assert event["sample_rate"] == pytest.approx(body["result"]["vae"]["expected_batch_size"] / ds.n_units)
    table = pd.read_parquet(io.BytesIO(download(client, body["id"], "synthetic.parquet")))
    assert len(table) == 300 and set(table["site"].dropna()) <= {"north", "south", "east"}
    assert "patient_id" not in table.columns  # the unit column is never synthesized


def test_the_schemas_declarations_hold_in_the_table(api, analyst, officer, make_dataset, grant,
                                                    django_capture_on_commit_callbacks):
    """Issue 24: ``integer`` at a range of 40,001 integers, ``decimals``, ``nullable: false``
    are accepted by the dataset schema and hold exactly in the synthetic table; the officer's
    report puts the score between its floor and ceiling."""
    rng = np.random.default_rng(5)
    n = 3000
    grade = rng.choice(list("ABC"), n)
    frame = pd.DataFrame({
        "amount": rng.integers(1, 41, n) * 1000,
        "rate": np.where(grade == "A", 6.08, np.where(grade == "B", 10.9, 15.05)),
        "grade": grade,
        "emp": np.where(rng.random(n) < 0.1, np.nan, rng.integers(0, 11, n)),
    })
    ds = make_dataset("loans", epsilon=10.0, frame=frame, schema={
        "amount": {"type": "numeric", "lower": 0, "upper": 40_000, "integer": True, "nullable": False},
        "rate": {"type": "numeric", "lower": 5, "upper": 35, "decimals": 2, "nullable": False},
        "grade": {"type": "categorical", "domain": ["A", "B", "C"], "nullable": False},
        "emp": {"type": "numeric", "lower": 0, "upper": 10, "integer": True}})
    grant(analyst, ds)
    client = api(analyst)
    body = run(client, {"epsilon": 3.0, "holdout_fraction": 0.2, "target": "grade"},
               django_capture_on_commit_callbacks, dataset="loans")
    table = pd.read_parquet(io.BytesIO(download(client, body["id"], "synthetic.parquet")))
    assert table[["amount", "rate", "grade"]].notna().all().all()
    assert (table["amount"] == np.round(table["amount"])).all() and (table["amount"] % 1000 == 0).mean() > 0.7
    assert np.allclose(np.round(table["rate"], 2), table["rate"])
    assert table["rate"].isin([6.08, 10.9, 15.05]).mean() > 0.9
    s = Request.objects.get(pk=body["id"]).officer_report["quality"]["summary"]
    assert s["bivariate_accuracy"] > s["bivariate_accuracy_floor"] + 0.05
    assert s["tstr_interval"][0] <= s["tstr"] <= s["tstr_interval"][1]


def test_a_grid_on_bounds_far_from_zero_registers(make_dataset):
    """The check that a grid value lies in the bounds does no grid arithmetic on wide
    bounds (decimals 9 on +-8e307 would overflow it): registered, not a 500."""
    make_dataset("wide", frame=pd.DataFrame({"x": [0.5, 0.25]}),
                 schema={"x": {"type": "numeric", "lower": -8e307, "upper": 8e307, "decimals": 9}})


@pytest.mark.parametrize("spec, problem", [
    ({"type": "numeric", "lower": 0, "upper": 1, "decimals": -1}, "decimals must be an integer"),
    ({"type": "numeric", "lower": 0, "upper": 1, "decimals": 1.5}, "decimals must be an integer"),
    ({"type": "numeric", "lower": 0, "upper": 1, "integer": True, "decimals": 2}, "0 decimals"),
    ({"type": "categorical", "domain": ["0.5"], "decimals": 1}, "only to numeric"),  # (x holds floats: "0.5" as written)
    ({"type": "categorical", "domain": ["a"]}, "'a' matches no row"),
    ({"type": "numeric", "lower": 0, "upper": 1, "nullable": "no"}, "nullable must be true or false"),
    ({"type": "numeric", "lower": 0.151, "upper": 0.159, "decimals": 2}, "no value with 2 decimals lies in"),
    ({"type": "numeric", "lower": 0.2, "upper": 0.8, "integer": True}, "no integer lies in [0.2, 0.8]"),
    ({"type": "numeric", "lower": -1e308, "upper": 1e308}, "span more than the largest number"),
])
def test_bad_declarations_are_refused(make_dataset, spec, problem):
    from governance.core.errors import InvalidDataset

    frame = pd.DataFrame({"x": [0.5, 0.25]})
    with pytest.raises(InvalidDataset) as e:
        make_dataset("bad", frame=frame, schema={"x": spec})
    assert problem in e.value.extra["errors"]["x"]
