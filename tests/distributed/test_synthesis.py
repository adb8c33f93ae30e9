"""MST on a real local Dask cluster: the marginals (one-way, every pair, the numeric
columns' grid histograms) counted per partition after a shuffle on the unit equal the
local engine's counts on the whole table; a synthesis request on a distributed dataset
runs through the REST API, its reports computed on samples and saying so."""

import numpy as np
import pytest

from engines import plugins
from engines.distributed import PartitionedTable
from engines.distributed import synthesis as dist
from engines.synthesis import encoding, mst
from engines.synthesis.execute import split
from engines.synthesis.params import Spec
from engines.types import DatasetMeta, EngineRequest

from .conftest import UNIT_COLUMNS
from .test_distributed_api import ask, events, on_cluster, parts_dir, register, table  # noqa: F401 (fixtures)


def test_it_counts_the_local_engines_marginals(dask_cluster, partitioned):
    data, manifest, _ = partitioned
    pids = data.column("pid").to_numpy()
    meta = DatasetMeta(name="t", columns=UNIT_COLUMNS, unit_column="pid", n_rows=data.num_rows,
                       n_units=len(np.unique(pids)), delta=1e-6, distributed=True)
    plan = plugins.plan("synthesis", EngineRequest("synthesize", {
        "method": "mst", "epsilon": 50.0, "rows": 100, "holdout_fraction": 0, "max_rows_per_unit": 40}), meta)
    spec = Spec.from_dict(plan.details["spec"])
    source = PartitionedTable(paths=tuple(p["path"] for p in manifest), columns=tuple(data.column_names),
                              num_rows=data.num_rows, unit_column="pid", scheduler=dask_cluster)
    got = dist.exact_counts(source, spec)
    train = split(data.to_pandas(), spec, np.random.default_rng(0)).train  # k above every unit's rows: all kept
    sizes = {c["column"]: encoding.cell_size(c) for c in spec.columns}
    want = mst.marginal_counts(encoding.cell_encode(train, spec.columns), sizes)
    assert list(got["counts"]["one"]) == list(want["one"]) and list(got["counts"]["two"]) == list(want["two"])
    for c in want["one"]:
        np.testing.assert_array_equal(got["counts"]["one"][c], want["one"][c])
    for pair in want["two"]:
        assert got["counts"]["two"][pair] == want["two"][pair]
    gridded = [c for c in spec.columns if encoding.has_fine(c)]
    fine = mst.fine_counts({c["column"]: encoding.grid_encode(train, c) for c in gridded},
                           {c["column"]: encoding.grid_size(c) for c in gridded})
    assert fine.keys() == got["fine"].keys() and all(np.array_equal(fine[c], got["fine"][c]) for c in fine)


@pytest.mark.django_db
def test_a_synthesis_request_runs_on_the_cluster(api, officer, analyst, events,  # noqa: F811
                                                 django_capture_on_commit_callbacks):
    from governance.models import Request

    params = {"method": "mst", "epsilon": 20.0, "rows": 1000, "holdout_fraction": 0.2, "bins": 8,
              "columns": ["age", "site", "flag"]}
    body = ask(api(analyst), "events", "synthesize", params, django_capture_on_commit_callbacks, engine="synthesis")
    assert body["status"] == "succeeded", body
    assert body["result"]["rows"] == 1000 and len(body["result"]["selected_pairs"]) == 2
    report = Request.objects.get(pk=body["id"]).officer_report
    assert "uniform samples of the private rows" in report["rows_compared"]
    assert report["cluster"]["partitions"] == 4 and report["quality"]["summary"]["overall_accuracy"] > 0.5
