"""A run: exact aggregate (compute.py), contribution bounding, OpenDP noise (noise.py),
result JSON (report.py). Uses only the noise the plan paid for: every measurement is
rebuilt from ``plan.details`` and its OpenDP map checked against the planned cost."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from engines.types import DatasetMeta, EngineError, EngineRequest, Plan, Release

from . import compute, noise, report
from .planner import DETAILS_VERSION, candidate_grid

REL_SLACK = 1e-9


def _check_cost(planned: float, actual: float) -> None:
    if not actual <= planned * (1 + REL_SLACK):
        raise EngineError(f"the run's measurement costs {actual}, more than the planned {planned}")


def execute(request: EngineRequest, dataset: DatasetMeta, data: pa.Table, plan: Plan, progress) -> Release:
    d = plan.details
    if d.get("version") != DETAILS_VERSION:
        raise EngineError("plan details from an unknown version of the aggregates engine")
    kind = d["kind"]
    n = data.num_rows
    rng = np.random.default_rng()

    progress({"phase": "filtering", "fraction": 0.05})
    mask = compute.predicate_mask(data, d["where"])
    values = None
    if kind in ("sum", "mean", "variance", "quantile") or (kind == "histogram" and d["histogram"]["type"] == "numeric"):
        lo, hi = d["bounds"]
        values, nan = compute.clamped_values(data, d["column"], lo, hi)  # a new array, owned by this run
        if nan is not None:
            mask &= ~nan
    codes, groups = None, 0
    if kind == "histogram":
        hist = d["histogram"]
        if hist["type"] == "categorical":
            codes = compute.category_codes(data, d["column"], hist["labels"])
        else:
            codes = compute.bin_codes(values, hist["edges"])
        groups = len(hist["labels"])
    elif d["group_by"]:
        codes = compute.category_codes(data, d["group_by"], d["domain"])
        groups = len(d["domain"])
    if codes is not None:
        mask &= codes >= 0

    progress({"phase": "bounding contributions", "fraction": 0.25})
    if d["unit_column"]:
        units, n_units = compute.unit_codes(data, d["unit_column"])
        mask, _ = compute.bound_contributions(mask, units, n_units, int(d["max_rows_per_unit"]), rng)

    progress({"phase": "aggregating", "fraction": 0.5})
    # Every row selected (no where, no nulls, no out-of-domain group): use the arrays as
    # they are instead of copying them through the mask. Either way ``selected(values)``
    # is an array this run owns, so the steps below may overwrite it.
    every = bool(mask.all())

    def selected(a):
        return a if every else a[mask]

    sel_codes = selected(codes) if codes is not None else None
    if kind == "quantile":
        return Release(result=_quantile(d, selected(values), sel_codes, groups, progress))
    exact = {}
    if kind in ("count", "histogram", "mean", "variance"):
        exact["count"] = (n if every and codes is None
                          else compute.exact_count(mask, codes, groups, selected_codes=sel_codes))
    if kind == "sum":
        m = max(abs(d["bounds"][0]), abs(d["bounds"][1]))
        exact["sum"] = compute.exact_sum(selected(values), m, n, sel_codes, groups, overwrite=True)
    elif kind in ("mean", "variance"):
        r = d["radius"]
        y = selected(values)
        np.subtract(y, d["center"], out=y)
        np.clip(y, -r, r, out=y)
        if kind == "variance":
            sq = np.multiply(y, y)
            np.clip(sq, 0.0, r * r, out=sq)
            exact["sum_of_squares"] = compute.exact_sum(sq, r * r, n, sel_codes, groups, overwrite=True)
        exact["sum"] = compute.exact_sum(y, r, n, sel_codes, groups, overwrite=True)

    progress({"phase": "adding noise", "fraction": 0.8})
    nzs, noisy = {}, {}
    for name, comp in d["components"].items():
        nz = noise.Noise.from_dict(comp)
        _check_cost(comp["cost"], nz.cost())
        nzs[name] = nz
        noisy[name] = nz.release(exact[name])
    if kind in ("count", "sum", "histogram"):
        (name,) = nzs
        result = report.additive(d, noisy[name], nzs[name])
    else:
        result = report.ratio(d, noisy, nzs, rng)
    progress({"phase": "done", "fraction": 1.0})
    return Release(result=result)


def _quantile(d: dict, values: np.ndarray, codes, groups: int, progress) -> dict:
    qd = d["quantile"]
    _check_cost(qd["epsilon"], noise.noisy_min_cost(qd["scale"], qd["score_sensitivity"]))
    grid = candidate_grid(qd["grid"]["lower"], qd["grid"]["upper"], qd["grid"]["count"])
    scores = compute.quantile_scores(values, grid, qd["alpha_num"], qd["alpha_den"], codes, max(groups, 1))
    progress({"phase": "adding noise", "fraction": 0.8})
    picks = [float(grid[noise.noisy_argmin(row, qd["scale"])]) for row in scores]
    result = report.quantile(d, picks)
    progress({"phase": "done", "fraction": 1.0})
    return result
