"""MST synthesis on a Dask cluster: the marginals it measures are group-by counts, so they
are computed per partition and summed; selection, the graphical model and sampling run on
the driver (their size depends on the columns' domains, not on the rows).

Per partition, or with a unit column per unit bucket (``cluster.by_unit``: every row of
a unit in one bucket, no shuffle, nothing on disk): the local engine's ``split`` holds out the given fraction of the
partition's units and keeps at most k rows per training unit, ``encoding.encode`` codes
the columns, and ``mst.marginal_counts`` / ``mst.fine_counts`` count. The driver adds the
noise once (``mst.synthesize_from_counts``, ``mst.measure_fine_counts``: the plan's OpenDP
measurements), exactly as a local run does with the whole table's counts.

The officer's quality and privacy reports compare the synthetic table with private rows;
for a table that does not fit one worker they are computed on uniform samples of at most
``REPORT_SAMPLE_ROWS`` training and held-out rows (each row gets a random key; every
partition keeps its smallest keys, the driver the smallest of those), and the report says
so.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pyarrow as pa

from engines.synthesis import encoding, mst
from engines.synthesis import execute as local
from engines.synthesis.params import Spec

from . import cluster
from .source import PartitionedTable

__all__ = ["execute", "exact_counts", "REPORT_SAMPLE_ROWS"]

REPORT_SAMPLE_ROWS = 50_000


def _sample(df: pd.DataFrame, rng: np.random.Generator, cap: int) -> tuple[np.ndarray, pd.DataFrame]:
    keys = rng.random(len(df))
    keep = np.argsort(keys)[:cap]
    return keys[keep], df.iloc[keep].reset_index(drop=True)


def _counts(data: pa.Table, spec_dict: dict, cap: int) -> dict:
    df = data.to_pandas()
    spec = Spec.from_dict(spec_dict)
    rng = local.secure_rng()
    train, holdout, _, _ = local.split(df, spec, rng)
    sizes = {c["column"]: encoding.cell_size(c) for c in spec.columns}
    fine = [c for c in spec.columns if encoding.has_fine(c)]
    return {
        "counts": mst.marginal_counts(encoding.cell_encode(train, spec.columns), sizes),
        "fine": mst.fine_counts({c["column"]: encoding.grid_encode(train, c) for c in fine},
                                {c["column"]: encoding.grid_size(c) for c in fine}),
        "train": _sample(train, rng, cap), "holdout": _sample(holdout, rng, cap),
    }


def _merge_samples(samples: list[tuple[np.ndarray, pd.DataFrame]], cap: int):
    keys = np.concatenate([k for k, _ in samples])
    frame = pd.concat([f for _, f in samples], ignore_index=True)
    keep = np.argsort(keys)[:cap]
    return keys[keep], frame.iloc[keep].reset_index(drop=True)


def _combine(parts: list[dict], cap: int) -> dict:
    first = parts[0]
    out = {"counts": {"one": {c: sum(p["counts"]["one"][c] for p in parts) for c in first["counts"]["one"]},
                      "two": {k: sum(p["counts"]["two"][k] for p in parts) for k in first["counts"]["two"]}},
           "fine": {c: sum(p["fine"][c] for p in parts) for c in first["fine"]},
           "train": _merge_samples([p["train"] for p in parts], cap),
           "holdout": _merge_samples([p["holdout"] for p in parts], cap)}
    return out


def graph(table: PartitionedTable, spec: Spec, cap: int = REPORT_SAMPLE_ROWS):
    if spec.unit_column:
        leaves = cluster.by_unit(table, spec.unit_column, _counts, spec.to_dict(), cap)
    else:
        leaves = cluster.per_partition(table, _counts, spec.to_dict(), cap)
    return cluster.tree_reduce(leaves, functools.partial(_combine, cap=cap))


def exact_counts(table: PartitionedTable, spec: Spec, progress=None, cap: int = REPORT_SAMPLE_ROWS) -> dict:
    """The summed exact marginals (and report samples) of the whole table, on the cluster."""
    return cluster.compute(graph(table, spec, cap), table.scheduler, table.retries, progress,
                           phase="counting marginals on the cluster")


def execute(request, dataset, data: PartitionedTable, plan, progress, workdir):
    d = local.check_version(plan)
    spec = Spec.from_dict(d["spec"])
    progress({"phase": "counting marginals on the cluster", "fraction": 0.0})
    total = graph(data, spec)
    got = cluster.compute(total, data.scheduler, data.retries, progress, phase="counting marginals on the cluster")
    fine = mst.measure_fine_counts(got["fine"], d["mst"])
    scale = d["mst"]["fine"]["scale"] if fine else None
    heavy = {c["column"]: encoding.heavy_leaf_mass(c, fine[c["column"]], scale)
             for c in spec.columns if c["column"] in fine}
    codes, info, weights = mst.synthesize_from_counts(got["counts"], spec.columns, d["mst"], spec.rows, progress,
                                                      heavy=heavy)
    synthetic = encoding.cell_decode(codes, spec.columns, local.secure_rng(), weights, fine, scale)
    train, holdout = got["train"][1], got["holdout"][1]
    note = (f"uniform samples of the private rows: {len(train):,} training and {len(holdout):,} held-out rows "
            f"(at most {REPORT_SAMPLE_ROWS:,} each; the table is partitioned over a Dask cluster)")
    release = local.finish(d, spec, synthetic[spec.names], info, train, holdout, progress, workdir, note)
    from .aggregates import job

    if release.officer_report is not None:
        release.officer_report["cluster"] = job(data, total)
    return release
