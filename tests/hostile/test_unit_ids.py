"""Privacy-unit ids as they compare: a float column's -0.0 and 0.0 are one unit (Arrow's
kernels compared them by their bits: one person counted as two units at registration,
in ``n_units``, delta "auto" and the bound of a unit-level count), and a Parquet UUID (an
Arrow extension type) is an id like any other (its registration was a 500)."""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engines.aggregates import units
from engines.columns import unit_ids

pytestmark = pytest.mark.django_db


def test_negative_zero_is_the_same_unit_in_every_engine_path():
    table = pa.table({"pid": pa.array([0.0, -0.0, 1.0, 2.0, -0.0], pa.float32())})
    codes, _ = units.unit_codes(table, "pid")
    assert len(set(codes.tolist())) == 3 and codes[0] == codes[1] == codes[4]
    h = units.unit_hash(table.column("pid"))
    assert h[0] == h[1] == h[4] and len(set(h.tolist())) == 3
    assert unit_ids(pa.chunked_array([[-0.0], [0.0]])).to_pylist() == [0.0, 0.0]


def register(api, officer, import_dir, column: pa.Array, name="u"):
    pq.write_table(pa.table({"pid": column, "x": pa.array(np.arange(len(column)) % 7)}), import_dir / f"{name}.parquet")
    return api(officer).post("/api/datasets/", {
        "name": name, "path": str(import_dir / f"{name}.parquet"), "budget_epsilon": 1e6, "budget_delta": 1e-9,
        "unit_column": "pid", "activate": True, "schema": {"x": {"lower": 0, "upper": 6}}}, format="json")


def count(api, officer, sql, django_capture_on_commit_callbacks):
    client = api(officer)
    with django_capture_on_commit_callbacks(execute=True):
        r = client.post("/api/requests/", {"sql": sql, "params": {"epsilon": 1e5}}, format="json")
    assert r.status_code == 202, r.content
    out = client.get(f"/api/requests/{r.json()['id']}/").json()
    assert out["status"] == "succeeded", out
    return out["result"]


def test_a_float_unit_column_counts_negative_zero_as_zero(api, officer, import_dir,
                                                          django_capture_on_commit_callbacks):
    r = register(api, officer, import_dir, pa.array([0.0, -0.0, 1.0, 2.0]))
    assert r.status_code == 201, r.content
    assert (r.json()["n_units"], r.json()["max_rows_per_unit"]) == (3, 2)
    result = count(api, officer, "SELECT COUNT(DISTINCT pid) FROM u", django_capture_on_commit_callbacks)
    assert round(float(result["rows"][0][0] if "rows" in result else result["value"])) == 3, result


@pytest.mark.parametrize("kind", ["uuid", "json"])
def test_an_extension_typed_unit_column_registers_and_counts(api, officer, import_dir, kind,
                                                             django_capture_on_commit_callbacks):
    ids = [uuid.UUID(int=i % 5).bytes for i in range(12)] if kind == "uuid" else ['{"a": %d}' % (i % 5) for i in range(12)]
    r = register(api, officer, import_dir, pa.array(ids, pa.uuid() if kind == "uuid" else pa.json_()))
    assert r.status_code == 201, r.content
    assert (r.json()["n_units"], r.json()["max_rows_per_unit"]) == (5, 3)
    result = count(api, officer, "SELECT COUNT(DISTINCT pid) FROM u", django_capture_on_commit_callbacks)
    assert round(float(result["rows"][0][0] if "rows" in result else result["value"])) == 5, result


def register_csv(api, officer, import_dir, ids: list[str], name: str):
    (import_dir / f"{name}.csv").write_text("pid,x\n" + "".join(f"{i},{n % 7}\n" for n, i in enumerate(ids)))
    return api(officer).post("/api/datasets/", {
        "name": name, "path": str(import_dir / f"{name}.csv"), "budget_epsilon": 1e6, "budget_delta": 1e-9,
        "unit_column": "pid", "activate": True, "schema": {"x": {"lower": 0, "upper": 6}}}, format="json")


@pytest.mark.parametrize("spelled", [lambda i: f"{i:03d}", lambda i: f"{i}.0", lambda i: f" {i}"],
                         ids=["leading-zeros", "decimal", "leading-space"])
def test_csv_ids_compare_as_written_whatever_the_other_rows_hold(api, officer, import_dir, spelled,
                                                                 django_capture_on_commit_callbacks):
    """A CSV's unit column was typed from its values: "7" and "007" were one unit while every
    id read as a number, two once one person's id did not (a probe's: a table and that table
    plus one unit's row gave 100 and 201 units; a unit-level count moved by 101, its bound 1).
    Read as text, they are two units in both."""
    ids = [str(i) for i in range(100)] + [spelled(i) for i in range(100)]
    for name, rows in (("d", ids), ("d1", ids + ["x"])):
        r = register_csv(api, officer, import_dir, rows, name)
        assert r.status_code == 201, r.content
        assert (r.json()["n_units"], r.json()["max_rows_per_unit"]) == (len(set(rows)), 1), (name, r.json())
    result = count(api, officer, "SELECT COUNT(*) FROM d", django_capture_on_commit_callbacks)
    assert round(float(result["rows"][0][0] if "rows" in result else result["value"])) == 200, result
