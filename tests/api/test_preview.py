"""GET /api/datasets/{name}/preview/: dummy rows from the public schema only, free, for
whoever may see the dataset."""

import math

import pytest

from governance.models import Budget, Dataset, LedgerEntry
from tests.conftest import small_frame

pytestmark = pytest.mark.django_db

SCHEMA = {"age": {"lower": 18, "upper": 90, "integer": True}, "income": {"lower": 0, "upper": 200_000},
          "site": {"type": "categorical", "domain": ["north", "south", "east", "west"]}}


@pytest.fixture
def twins(make_dataset, analyst, grant):
    """Two datasets with the same schema and different rows (and row counts)."""
    a = make_dataset("twin-a", epsilon=1.0, unit_column="patient_id", schema=SCHEMA, frame=small_frame(200, seed=1))
    b = make_dataset("twin-b", epsilon=1.0, unit_column="patient_id", schema=SCHEMA, frame=small_frame(400, seed=2))
    grant(analyst, a)
    grant(analyst, b)
    return a, b


def test_it_does_not_depend_on_the_data(api, analyst, twins):
    client = api(analyst)
    a = client.get("/api/datasets/twin-a/preview/?rows=50&seed=7").json()
    b = client.get("/api/datasets/twin-b/preview/?rows=50&seed=7").json()
    assert a["data"] == b["data"] and a["columns"] == b["columns"] == ["patient_id", "age", "income", "site"]
    assert a["generated"] == b["generated"]
    other = client.get("/api/datasets/twin-a/preview/?rows=50&seed=8").json()
    assert other["data"] != a["data"]
    again = client.get("/api/datasets/twin-a/preview/?rows=50&seed=7").json()
    assert again["data"] == a["data"]  # reproducible


def test_it_follows_the_declared_types_bounds_and_domains(api, analyst, twins):
    body = api(analyst).get("/api/datasets/twin-a/preview/?rows=500").json()
    assert body["rows"] == 500 and body["seed"] == 0 and len(body["data"]) == 500
    unit, age, income, site = zip(*body["data"])
    assert all(isinstance(v, int) and 18 <= v <= 90 for v in age)
    assert all(isinstance(v, float) and 0 <= v <= 200_000 for v in income)
    assert set(site) == {"north", "south", "east", "west"}
    assert all(isinstance(v, int) and v >= 1 for v in unit)


def test_it_reads_no_rows_and_costs_nothing(api, analyst, twins, settings):
    a, _ = twins
    before = Budget.objects.get(pk=a.pk).state
    for path in settings.DATA_DIR.rglob("*"):  # the stored tables are gone: the preview does not need them
        if path.is_file():
            path.unlink()
    r = api(analyst).get("/api/datasets/twin-a/preview/?rows=10")
    assert r.status_code == 200, r.content
    assert Budget.objects.get(pk=a.pk).state == before and not LedgerEntry.objects.exists()


def test_only_those_who_see_the_dataset_get_it(api, analyst, analyst2, officer, twins, make_dataset, grant):
    draft = make_dataset("draft-one", schema=SCHEMA, activate=False)
    grant(analyst, draft)
    assert api(analyst2).get("/api/datasets/twin-a/preview/").status_code == 404  # no grant
    assert api(analyst).get("/api/datasets/draft-one/preview/").status_code == 404  # a draft
    assert api().get("/api/datasets/twin-a/preview/").json()["code"] == "auth.required"
    assert api(officer).get("/api/datasets/draft-one/preview/").status_code == 200


@pytest.mark.parametrize("query,field", [("rows=0", "rows"), ("rows=10001", "rows"), ("rows=ten", "rows"), ("rows=1_0", "rows"), ("rows=%D9%A5", "rows"),
                                         ("seed=-1", "seed"), ("seed=" + "9" * 5000, "seed")])
def test_bad_parameters_are_400(api, analyst, twins, query, field):
    r = api(analyst).get(f"/api/datasets/twin-a/preview/?{query}")
    assert r.status_code == 400 and r.json()["code"] == "request.invalid" and field in r.json()["errors"]


def test_a_wide_table_gets_fewer_rows(api, analyst, twins, monkeypatch):
    from governance.datasets import preview

    monkeypatch.setattr(preview, "MAX_PREVIEW_CELLS", 400)  # 4 columns: at most 100 rows
    assert api(analyst).get("/api/datasets/twin-a/preview/?rows=100").status_code == 200
    r = api(analyst).get("/api/datasets/twin-a/preview/?rows=101")
    assert r.status_code == 400 and "at most 100 rows" in r.json()["detail"]


def test_long_category_labels_get_fewer_rows(api, analyst, twins, monkeypatch):
    """A probe's 10 MB cell, proposed as a category, made a 20-row preview 94 MB: a row's
    size counts its columns' widest values (and a category's label is now at most 1,000
    characters: tests/api/test_datasets.py)."""
    from governance.datasets import preview

    monkeypatch.setattr(preview, "MAX_PREVIEW_BYTES", 100_000)
    ds = Dataset.objects.get(name="twin-a")
    schema = ds.schema
    for c in schema["columns"]:
        if c["type"] == "categorical":
            c["domain"] = [c["domain"][0] + "x" * 999] + c["domain"][1:]
    Dataset.objects.filter(pk=ds.pk).update(schema=schema)
    most = preview.max_rows(schema["columns"])
    assert 10 < most < 100
    assert api(analyst).get(f"/api/datasets/twin-a/preview/?rows={most}").status_code == 200
    r = api(analyst).get(f"/api/datasets/twin-a/preview/?rows={most + 1}")
    assert r.status_code == 400 and f"at most {most} rows" in r.json()["detail"]


# ---- a property of the generator: every value lies inside what the schema declares

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from governance.datasets.preview import dummy_rows  # noqa: E402

_bounds = st.tuples(st.floats(-1e12, 1e12), st.floats(-1e12, 1e12)).filter(lambda b: b[0] < b[1])
_column = st.one_of(
    st.builds(lambda b, i: {"type": "numeric", "lower": b[0], "upper": b[1], "integer": i}, _bounds, st.booleans()),
    st.builds(lambda b, d: {"type": "numeric", "lower": b[0], "upper": b[1], "integer": False, "decimals": d},
              st.tuples(st.floats(-1e6, 1e6), st.floats(-1e6, 1e6)).filter(lambda b: b[0] < b[1]), st.integers(0, 6)),
    st.builds(lambda d: {"type": "categorical", "domain": d},
              st.lists(st.one_of(st.text(max_size=5), st.integers(), st.booleans()), min_size=1, max_size=6,
                       unique_by=lambda v: (type(v).__name__, v))),
    st.just({"type": "text"}), st.just({"type": "numeric", "lower": None, "upper": None}))


@settings(max_examples=100, deadline=None)
@given(columns=st.lists(_column, min_size=1, max_size=5), rows=st.integers(0, 50), seed=st.integers(0, 2**32 - 1))
def test_generated_values_stay_inside_the_declared_schema(columns, rows, seed):
    cols = [{"name": f"c{i}", **c} for i, c in enumerate(columns)]
    out = dummy_rows(cols, None, rows, seed)
    assert out == dummy_rows(cols, None, rows, seed)  # a function of (schema, rows, seed) alone
    assert len(out["data"]) == rows and out["columns"] == [c["name"] for c in cols]
    for j, c in enumerate(cols):
        values = [r[j] for r in out["data"]]
        if c["type"] == "numeric" and c["lower"] is not None:
            assert all(c["lower"] <= v <= c["upper"] for v in values)
            if c["integer"] and any(isinstance(v, int) for v in values):
                assert all(isinstance(v, int) for v in values)
            d = c.get("decimals")
            if d is not None and math.floor(c["upper"] * 10**d) > math.ceil(c["lower"] * 10**d):
                assert all(round(v, d) == v for v in values)  # on the grid (a probe: full float precision)
        elif c["type"] == "categorical":
            assert all(any(v == d and type(v) is type(d) for d in c["domain"]) for v in values)
