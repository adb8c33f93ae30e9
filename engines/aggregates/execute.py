"""A run: exact aggregate (compute.py), contribution bounding, OpenDP noise (noise.py),
result JSON (report.py). The exact aggregate comes in additive parts (``exact_parts``,
``combine``), so a distributed backend (engines/distributed) computes them per partition
and shares the rest (``finish``: noise once, report). Uses only the noise the plan paid for: every measurement is
rebuilt from ``plan.details`` and its OpenDP map checked against the planned cost."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from engines.types import DatasetMeta, EngineError, EngineRequest, Plan, Release

from . import compute, noise, report, units
from .planner import DETAILS_VERSION, candidate_grid

REL_SLACK = 1e-9


def _check_cost(planned: float, actual: float) -> None:
    if not actual <= planned * (1 + REL_SLACK):
        raise EngineError(f"the run's measurement costs {actual}, more than the planned {planned}")


def check_version(plan: Plan) -> dict:
    """The plan's details, of this engine's version, with their bounds, edges and grids as
    floats (``as_planned``)."""
    d = plan.details_of("aggregates", DETAILS_VERSION)
    return as_planned(d)


FLOAT_KEYS = frozenset({"bounds", "edges", "lower", "upper", "center", "radius"})


def as_planned(x, floats: bool = False):
    """Plan details with the numbers the planner wrote as floats (under ``FLOAT_KEYS``:
    bounds, bin edges, a quantile grid's ends, a mean's center and radius) floats again.
    PostgreSQL's jsonb keeps a number's value, not its type: a float of 1e16 or more comes
    back as an integer (1e150 as 10**150), and numpy takes a list of such integers as
    objects (a quantile's grid, a histogram's edges: the run failed after the read). The
    analyst's values (where clauses, labels, domains) are left as they are: an int64
    unit id past 2**53 must stay exact."""
    if isinstance(x, dict):
        return {k: as_planned(v, floats or k in FLOAT_KEYS) for k, v in x.items()}
    if isinstance(x, list):
        return [as_planned(v, floats) for v in x]
    if floats and isinstance(x, int) and not isinstance(x, bool):
        return float(x)
    return x


def execute(request: EngineRequest, dataset: DatasetMeta, data: pa.Table, plan: Plan, progress) -> Release:
    d = check_version(plan)
    rng = np.random.default_rng()
    n = grid_rows(d)
    return finish(d, exact_parts(d, data, n, rng, progress), n, rng, progress)


def grid_rows(d: dict) -> int:
    """The number of summed values every grid sum of the plan ``d`` is scaled to
    (``compute.grid_sum``'s ``n_max``): the registered rows plus one more unit's k. It is
    a number of the plan, public and fixed before any row is read, so a table and each of
    its neighbours (a unit's rows more or fewer) are summed on the same grid and differ by
    at most k * B. Scaled to the rows the run finds instead, one more row could cross a
    power of two, change every row's truncation and move the sum by up to n * 2^-e more
    than the sensitivity (a probe: 8 x k * B at 4M rows, more at 67M)."""
    return max(int(d["n_rows"]), 0) + max(int(d.get("max_rows_per_unit") or 1), 1)


def _noop(update: dict) -> None:
    return None


def exact_parts(d: dict, data: pa.Table, n_max: int, rng: np.random.Generator, progress=_noop,
                salt: int | None = None) -> dict:
    """The exact aggregate of ``data`` in additive parts (``combine`` adds the parts of
    disjoint pieces of a table into those of the whole): ``count`` (int, or int64 per
    group), ``sum`` / ``sum_of_squares`` in grid units (``compute.grid_sum`` with
    ``n_max`` = ``grid_rows(d)``, the plan's bound on the values summed), ``quantile`` histograms. Contribution
    bounding happens here, so ``data`` must hold every row of each privacy unit it holds
    (the whole table, or one of engines/distributed's unit buckets). Which rows a unit over
    k keeps is ``units.bound_by_content`` with ``salt`` (drawn from ``rng`` if None): the
    same rows on any partitioning given the same salt."""
    kind = d["kind"]
    n = data.num_rows
    if kind == "query":  # each aggregate's parts, under its index (combine adds them by name)
        if salt is None and d["unit_column"]:
            salt = int(rng.integers(0, 2**63))
        return {f"{i}:{name}": v for i, sub in enumerate(d["aggregates"])
                for name, v in exact_parts(sub, data, n_max, rng, progress, salt).items()}

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
    elif d.get("group_keys"):
        codes, groups = compute.group_codes(data, d["group_keys"])
    elif d["group_by"]:
        codes = compute.category_codes(data, d["group_by"], d["domain"])
        groups = len(d["domain"])
    if codes is not None:
        mask &= codes >= 0
    distinct = d.get("distinct_of")  # COUNT(DISTINCT column): each row's index among its public values
    if distinct is not None:
        dcodes = compute.category_codes(data, d["column"], distinct)
        mask &= dcodes >= 0
        values = dcodes.astype(np.float64)  # (a kept row's content: which rows a unit keeps)
    if d["unit_column"]:
        ucodes, n_units = units.unit_codes(data, d["unit_column"])
        if d.get("distinct_units"):
            # COUNT(DISTINCT unit): one row per (unit, group); bounding then keeps k groups per unit
            mask = units.first_per_pair(mask, ucodes, codes)

    progress({"phase": "bounding contributions", "fraction": 0.25})
    if d["unit_column"]:
        if salt is None:
            salt = int(rng.integers(0, 2**63))
        k = int(d["max_rows_per_unit"])
        if kind == "count" and codes is None and distinct is None:
            # each kept row adds one: the count of the rows the rule keeps, without choosing them
            return {"count": units.bounded_count(mask, ucodes, n_units, k)}
        mask, _ = units.bound_by_content(mask, ucodes, n_units, k, salt, data.column(d["unit_column"]), codes, values)

    progress({"phase": "aggregating", "fraction": 0.5})
    # Every row selected (no where, no nulls, no out-of-domain group): use the arrays as
    # they are instead of copying them through the mask. Either way ``selected(values)``
    # is an array this run owns, so the steps below may overwrite it.
    every = bool(mask.all())

    def selected(a):
        return a if every else a[mask]

    sel_codes = selected(codes) if codes is not None else None
    if kind == "quantile":
        qd = d["quantile"]
        grid = candidate_grid(qd["grid"]["lower"], qd["grid"]["upper"], qd["grid"]["count"])
        return {"quantile": compute.quantile_histograms(selected(values), grid, sel_codes, max(groups, 1))}
    parts = {}
    if distinct is not None:  # whether some kept row holds (group, value): booleans, which add as OR over
        m = len(distinct)  # pieces (``combine``), a byte a cell: the rows per cell, int64, took 8 (a probe:
        at = dcodes[mask] if sel_codes is None else sel_codes * m + dcodes[mask]  # 3.4 GB on 2 Dask workers
        seen = np.zeros(max(groups, 1) * m, dtype=bool)  # for a query of 20M cells)
        seen[at] = True
        return {"distinct": seen.reshape(groups, m) if sel_codes is not None else seen}
    if kind in ("count", "histogram", "mean", "variance"):
        parts["count"] = (n if every and codes is None
                          else compute.exact_count(mask, codes, groups, selected_codes=sel_codes))
    if kind == "sum":
        parts["sum"] = compute.grid_sum(selected(values), _bounds(d)["sum"], n_max, sel_codes, groups,
                                        overwrite=True)
    elif kind in ("mean", "variance"):
        r = d["radius"]
        y = selected(values)
        np.subtract(y, d["center"], out=y)
        np.clip(y, -r, r, out=y)
        if kind == "variance":
            sq = np.multiply(y, y)
            np.clip(sq, 0.0, r * r, out=sq)
            parts["sum_of_squares"] = compute.grid_sum(sq, r * r, n_max, sel_codes, groups, overwrite=True)
        parts["sum"] = compute.grid_sum(y, r, n_max, sel_codes, groups, overwrite=True)
    return parts


def _bounds(d: dict) -> dict:
    """The clamping bound of each summed component (what its grid is scaled to)."""
    if d["kind"] == "sum":
        return {"sum": max(abs(d["bounds"][0]), abs(d["bounds"][1]))}
    if d["kind"] in ("mean", "variance"):
        r = d["radius"]
        return {"sum": r, "sum_of_squares": r * r}
    return {}


def combine(parts: list[dict]) -> dict:
    """The parts of disjoint pieces of a table added into those of the whole (exact: counts
    and histograms are integers, grid sums integer-valued floats below 2^53; a distinct
    count's cells are booleans, for which numpy's + is OR)."""
    out: dict = {}
    for p in parts:
        for name, v in p.items():
            out[name] = v if name not in out else out[name] + v
    return out


def exact_values(d: dict, parts: dict, n_max: int) -> dict:
    """The exact aggregates (what noise is added to) from the combined parts."""
    bounds = _bounds(d)
    out = {name: compute.from_grid(v, bounds[name], n_max) if name in bounds else v
           for name, v in parts.items() if name != "distinct"}
    if "distinct" in parts:  # COUNT(DISTINCT column): the values with a row, per group
        seen = np.count_nonzero(np.asarray(parts["distinct"]) > 0, axis=-1)
        out["count"] = int(seen) if seen.ndim == 0 else seen.astype(np.int64)
    return out


def finish(d: dict, parts: dict, n_max: int, rng: np.random.Generator, progress) -> Release:
    """Noise, once, on the exact aggregate of the whole table, and the result JSON."""
    kind = d["kind"]
    if kind == "query":
        from .query import assemble

        results = []
        for i, sub in enumerate(d["aggregates"]):
            own = {name.split(":", 1)[1]: v for name, v in parts.items() if name.split(":", 1)[0] == str(i)}
            results.append(finish(sub, own, n_max, rng, progress).result)
        return Release(result=assemble(d, results))
    if kind == "quantile":
        return Release(result=_quantile(d, parts["quantile"], progress))
    exact = exact_values(d, parts, n_max)
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


def _ends_held(qd: dict, hists: np.ndarray, grid: np.ndarray, shown: list) -> list[tuple[bool, bool]]:
    """Per group, whether each end of the interval as it would be shown ([L, H]) is confirmed
    on its side of the q-quantile: a noisy value, through OpenDP's discrete Laplace, of
    den #(x <= c_H) - num n for the last candidate c_H <= H (at least 0 iff c_H, so H, is
    at or above the quantile) and of num n - den #(x < c_L) for the first candidate
    c_L >= L (L at or below it), past its one-sided 97.5% margin: a wrong end passes with
    probability <= 2.5%. Where many rows tie at the quantile, the scores jump past the
    ends' shift and a pick can land on the wrong side, many candidates off (a probe: 50-57%
    coverage); an end not confirmed is the grid's bound (report.py)."""
    ch = qd["interval"]["check"]
    nz = noise.Noise.from_dict(ch)
    _check_cost(ch["epsilon"], nz.cost())
    num, den = qd["alpha_num"], qd["alpha_den"]
    lt, le, n = compute.rank_counts(hists)
    m, groups = len(grid), range(len(n))
    c_lo = [min(int(np.searchsorted(grid, lo, side="left")), m - 1) for lo, _ in shown]
    c_hi = [max(int(np.searchsorted(grid, hi, side="right")) - 1, 0) for _, hi in shown]
    above = nz.release([den * int(le[g, c_hi[g]]) - num * int(n[g]) for g in groups])
    below = nz.release([num * int(n[g]) - den * int(lt[g, c_lo[g]]) for g in groups])
    # at least 1: a group with no rows has 0 for every candidate (no side to be on), and at a
    # very large epsilon the margin is 0, which confirmed both ends of a third of empty groups
    need = max(ch["margin"], 1)
    return [(below[g] >= need, above[g] >= need) for g in groups]


def _quantile(d: dict, hists: np.ndarray, progress) -> dict:
    qd = d["quantile"]
    _check_cost(qd["epsilon"], noise.noisy_min_cost(qd["scale"], qd["score_sensitivity"]))
    grid = candidate_grid(qd["grid"]["lower"], qd["grid"]["upper"], qd["grid"]["count"])
    scores = compute.scores_from_histograms(hists, qd["alpha_num"], qd["alpha_den"])
    progress({"phase": "adding noise", "fraction": 0.8})
    picks = [float(grid[noise.noisy_argmin(row, qd["scale"])]) for row in scores]
    ends = None
    if "interval" in qd:  # plans from before intervals (stored, replayed) have none
        iv = qd["interval"]
        _check_cost(iv["epsilon"], noise.noisy_min_cost(iv["scale"], qd["score_sensitivity"]))
        signed = compute.signed_scores_from_histograms(hists, qd["alpha_num"], qd["alpha_den"])
        lows = [noise.noisy_argmin(np.abs(row + iv["shift"]), iv["scale"]) for row in signed]
        highs = [noise.noisy_argmin(np.abs(row - iv["shift"]), iv["scale"]) for row in signed]
        ends = [(float(grid[a]), float(grid[b])) for a, b in zip(lows, highs)]
        if "check" in iv:  # plans from before the checks have none
            shown = [report.quantile_interval(d, p, e) for p, e in zip(picks, ends)]
            ends = [(*e, *held) for e, held in zip(ends, _ends_held(qd, hists, grid, shown))]
    result = report.quantile(d, picks, ends)
    progress({"phase": "done", "fraction": 1.0})
    return result
