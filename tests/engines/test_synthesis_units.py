"""MST and AIM on a table with many rows per privacy unit: at most k rows of each unit are
kept, so without a correction a unit with r > k rows weighs k / r of its share and the
synthetic table under-represents the busiest units. Each kept row carries the bucket of
its unit's rows as one more (never output) column of the model, and the sample is drawn
from the model tilted by r / k (params.model_columns, mst.tilt)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from engines import plugins
from engines.synthesis import encoding
from engines.synthesis.params import (UNIT_ROWS, UNIT_ROWS_TOP, unit_rows_bucket, unit_rows_edges,
                                      unit_rows_weights)
from engines.types import DatasetMeta, EngineRequest
from tests.engines.synthesis_helpers import synthesize

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SCHEMA = {
    "pid": {"type": "unit"},
    "kind": {"type": "categorical", "domain": ["few", "many"], "nullable": False},
    "visits": {"type": "numeric", "lower": 0, "upper": 100, "integer": True, "nullable": False},
}


def _clinic(seed: int = 0) -> pd.DataFrame:
    """3,000 patients: 80% seen 1-3 times ("few"), 20% seen 30-60 times ("many"); about
    85% of the rows are of the busy 20%. ``visits``: the patient's visit number."""
    rng = np.random.default_rng(seed)
    many = rng.random(3000) < 0.2
    rows = np.where(many, rng.integers(30, 61, 3000), rng.integers(1, 4, 3000))
    pid = np.repeat(np.arange(3000), rows)
    visits = np.concatenate([np.arange(1, r + 1) for r in rows])
    return pd.DataFrame({"pid": pid, "kind": np.where(many[pid], "many", "few"), "visits": visits})


def _meta(df: pd.DataFrame) -> DatasetMeta:
    return DatasetMeta(name="clinic", columns=SCHEMA, unit_column="pid", n_rows=len(df),
                       n_units=int(df["pid"].nunique()), delta=1e-6)


def _run(df: pd.DataFrame, method: str, epsilon: float, **params):
    return synthesize(df, _meta(df), {"method": method, "epsilon": epsilon, "rows": 20_000, "holdout_fraction": 0,
                                      **params})


@pytest.fixture(scope="module")
def clinic():
    return _clinic()


# |share - real| is bounded by ``off``. Unseeded runs (OpenDP noise): MST at k = 11 gave
# -0.004 to +0.016 (11 runs, sd 0.004), MST at k = 1 -0.018 to -0.008 (10, sd 0.003): 0.06 is
# 12+ sd away. AIM gave -0.001 to +0.016 in 28 of 29 runs and -0.024 in one (mean +0.007,
# sd 0.008 with it): a second mode, so its line is 0.1. Without the reweighting the share is
# what k rows per unit give, 0.26 under real at k = 11 (0.65 at k = 1): both lines fail it.
@pytest.mark.parametrize("method,params,off", [("mst", {}, 0.06), ("aim", {}, 0.1),
                                               ("mst", {"max_rows_per_unit": 1}, 0.06)])
def test_busy_units_weigh_what_their_rows_weigh(clinic, method, params, off):
    """At the default k (the mean rows per unit, 11) and at k = 1, where a busy patient's
    30-60 rows are 30-60 times k (the buckets reach 64 k)."""
    real = float((clinic["kind"] == "many").mean())  # ~0.85 of the rows
    syn, plan, release = _run(clinic, method, 4.0, **params)
    k = plan.details["spec"]["max_rows_per_unit"]
    kept = clinic.groupby("pid").head(k)
    bounded = float((kept["kind"] == "many").mean())  # what k rows per unit alone would give (~0.6)
    assert real - bounded > 0.15
    share = float((syn["kind"] == "many").mean())
    assert abs(share - real) < off, (share, real, bounded)
    # the busy patients' visits go past k: their later visits are drawn too
    assert (syn["visits"] > 2 * k).mean() > 0.3 * (clinic["visits"] > 2 * k).mean()
    assert list(syn.columns) == ["kind", "visits"] and UNIT_ROWS not in release.result["columns"]
    assert syn["kind"].notna().all() and (syn["visits"] == np.round(syn["visits"])).all()


def test_the_plan_models_and_charges_the_bucket_column(clinic):
    _, plan, _ = _run(clinic.head(2000), "mst", 1.0)
    spec = plan.details["spec"]
    assert spec["unit_weighting"] is True and UNIT_ROWS not in plan.columns
    declared = sum(encoding.one_way_releases(c) for c in spec["columns"])
    assert plan.details["mst"]["one_way_releases"] == declared + 1  # the bucket column's one-way histogram
    assert plan.event["events"][0]["count"] == declared + 1
    no_unit = DatasetMeta(name="t", columns={c: s for c, s in SCHEMA.items() if c != "pid"}, unit_column=None,
                          n_rows=2000, n_units=2000, delta=1e-6)
    flat = plugins.plan("synthesis", EngineRequest("synthesize", {"method": "mst", "epsilon": 1.0}), no_unit)
    assert flat.details["spec"]["unit_weighting"] is False
    # the cluster's MST (engines/distributed/synthesis.py) is not reweighted: no bucket column there
    cluster = DatasetMeta(name="t", columns=SCHEMA, unit_column="pid", n_rows=2000, n_units=400, delta=1e-6,
                          distributed=True)
    on_cluster = plugins.plan("synthesis", EngineRequest("synthesize", {"method": "mst", "epsilon": 1.0}), cluster)
    assert on_cluster.details["spec"]["unit_weighting"] is False


@settings(max_examples=300, deadline=None)
@given(k=st.integers(1, 1000), ratio=st.floats(0.001, UNIT_ROWS_TOP))
def test_a_bucket_weight_is_close_to_rows_over_k(k, ratio):
    """Within the buckets' range the weight of r's bucket is max(r, k) / k to within the
    bucket's width; past UNIT_ROWS_TOP k every unit gets the last bucket's weight."""
    r = max(1, int(round(ratio * k)))
    b = int(unit_rows_bucket(np.array([r]), k)[0])
    w = unit_rows_weights(k)
    assert len(w) == len(unit_rows_edges(k)) + 1 and w[0] == 1.0 and np.all(np.diff(w) > 0)
    want = max(r, k) / k
    assert want / 1.5 <= w[b] <= want * 1.5
    assert unit_rows_bucket(np.array([UNIT_ROWS_TOP * k + 1]), k)[0] == len(w) - 1


def test_unit_weighting_can_be_turned_off_and_is_checked(clinic):
    meta = DatasetMeta(name="clinic", columns=SCHEMA, unit_column="pid", n_rows=2000, n_units=400, delta=1e-6)
    on = plugins.plan("synthesis", EngineRequest("synthesize", {"method": "aim", "epsilon": 1.0}), meta)
    off = plugins.plan("synthesis", EngineRequest("synthesize", {"method": "aim", "epsilon": 1.0,
                                                                 "unit_weighting": False}), meta)
    assert on.details["spec"]["unit_weighting"] is True and off.details["spec"]["unit_weighting"] is False
    assert off.details["aim"]["one_way_releases"] == on.details["aim"]["one_way_releases"] - 1
    flat = DatasetMeta(name="t", columns={c: s for c, s in SCHEMA.items() if c != "pid"}, unit_column=None,
                       n_rows=2000, n_units=2000, delta=1e-6)
    for ds, params, field in [(meta, {"unit_weighting": "yes"}, "must be true or false"),
                              (meta, {"unit_weighting": True, "method": "vae"}, "only for mst and aim"),
                              (flat, {"unit_weighting": True}, "only for mst and aim")]:
        with pytest.raises(Exception, match=field) as e:
            plugins.plan("synthesis", EngineRequest("synthesize", {"epsilon": 1.0, **params}), ds)
        assert "unit_weighting" in e.value.errors


def test_the_reports_compare_with_every_row_of_the_training_units(clinic):
    """Not only the k rows kept per unit: the table is meant to look like the real one."""
    _, plan, release = synthesize(clinic, _meta(clinic), {"method": "mst", "epsilon": 4.0, "rows": 5_000,
                                                          "holdout_fraction": 0.2, "target": "kind"})
    rows = release.officer_report["quality"]["rows"]
    k = plan.details["spec"]["max_rows_per_unit"]
    assert rows["train"] + rows["holdout"] == len(clinic)  # every row of a unit, on one side or the other
    assert rows["train"] > clinic.groupby("pid").head(k).shape[0]  # more than k rows per unit could give


def test_the_bucket_column_stays_out_of_the_rows_the_reports_compare_with(clinic):
    """Also when no unit has more than k rows (bounding keeps every row)."""
    from engines.synthesis.execute import split
    from engines.synthesis.params import Spec

    one_each = clinic.groupby("pid").head(1).reset_index(drop=True)
    plan = plugins.plan("synthesis", EngineRequest("synthesize", {"method": "mst", "epsilon": 4.0}), _meta(one_each))
    spec = Spec.from_dict(plan.details["spec"])
    assert spec.unit_weighting and spec.max_rows_per_unit == 1
    got = split(one_each, spec, np.random.default_rng(0))
    assert UNIT_ROWS in got.train.columns and list(got.compared.columns) == ["kind", "visits"]
    assert len(got.compared) == len(got.train)
