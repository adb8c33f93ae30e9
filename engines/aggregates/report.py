"""From noisy values to the result JSON, with 95% intervals (post-processing only).

Intervals describe the added noise, not sampling error: they hold, with probability 95%
each, the exact answer on the rows as the query takes them (values clamped to the declared
bounds, at most k rows per unit), not the unclamped value nor a population's.

- count / sum / histogram: value +- h, where P(|noise| >= h) <= 5% for the declared
  noise (Laplace: b ln 20; Gaussian: 1.96 sigma; discrete versions from OpenDP's
  accuracy helpers); a count's interval starts at 0 at the lowest (at its value, if that
  was drawn below 0).
- mean / variance: the estimator is a ratio of noisy values, so the interval is a
  parametric bootstrap: the declared noise distributions are drawn again around the
  released noisy components and the estimator recomputed; the 2.5% and 97.5% points are
  reported; where more than 2.5% of the simulations are clipped (at a bound, a variance at
  0) that end is the clip's bound, and where the count could be under one row both ends
  are. Only released values are used, so numpy's generator is fine here.
- quantile: the interval is released with the answer, at 9/16 of the quantile's budget
  (the answer gets the rest; planner.py): two more picks (7/32 of the budget each), each
  then confirmed on its side by a noisy count (1/16 each; below), by the same OpenDP
  report-noisy-max on the same candidate grid, on the score shifted by t score units:
  ``|s(c) + t|`` for the low end and ``|s(c) - t|`` for the high end, where
  ``s(c) = (1-q) #(x < c) - q #(x > c)`` (OpenDP's score before its absolute value; in units
  of 1 / alpha_den) and t = ceil(s_e ln(40 m)) for the ends' noise scale s_e. With
  probability >= 97.5% each end's score is within t of its best (the bound below, at 2.5%),
  so the low end has s <= 0 (at or below the q-quantile) and the high end s >= 0: the pair
  holds the true q-quantile with probability >= 95%, up to the grid's resolution (where
  some candidate's score reaches -t, +t: the lowest candidate's is -q n, the highest's
  (1 - q) n, with n the registered rows; past that, or where an end falls on the wrong
  side of the answer, that end is the grid's bound), which is
  why each end is moved one grid step further out (and the interval holds the answer); on a
  column declared integer the ends are rounded out to whole numbers first (many rows tie at
  each value, and a pick between two values stands for both), on one declared with
  decimals to them. Ties break the picks' bound: where many rows share a value (a column
  mostly 0, values on a coarser step than the grid's) the score jumps past +-t between
  two neighbouring candidates, no candidate's score is near the shifted target, and an
  end can land on the wrong side of the jump, anywhere on the flat run of candidates
  below it (a probe: 50-57% coverage on such columns of a weather table). So each end,
  as it would be shown, is confirmed on its side (execute._ends_held): den #(x <= c) -
  num n for the high end (c the last candidate at or below it; at least 0 iff it is at or
  above the quantile), num n - den #(x < c) for the low end, each with OpenDP's discrete
  Laplace noise (sensitivity k max(num, den - num)) and compared with its one-sided 97.5%
  margin: a wrong end passes with probability at most 2.5%, whatever the picks did, and
  an end not confirmed is the grid's bound. On tied values the interval is then honest
  and wide; declaring the column's integer or decimal grid makes it narrow.
  The shift is a constant, so the shifted score has the sensitivity of the score, and both
  ends cost what OpenDP's map of the chain says, like the answer. Only released picks and
  public numbers make the interval: it reads no data. ``rank_error95`` says how good
  the pick is: with probability >= 95% the released candidate c satisfies
  ``|(1-q) #(x < c) - q #(x > c)| <= best + rank_error95``, where ``best`` is the smallest
  such value on the grid (about the number of rows tied at the best candidate), so for
  distinct values c's rank is within about ``rank_error95`` rows of q * n. (With
  exponential noise E_i of scale s on m scores, the pick loses at most max_i E_i, and
  P(max_i E_i > s ln(20 m)) <= 5%; the score unit is 1 / alpha_den.)
"""

from __future__ import annotations

import math

import numpy as np

from .noise import Noise

SIMULATIONS = 20_000
SIM_BUDGET = 4_000_000  # groups x simulations


def _simulate(nz: Noise, shape, rng: np.random.Generator) -> np.ndarray:
    b = nz.scale
    if nz.mechanism == "laplace":
        if nz.integer:  # discrete Laplace: difference of two geometrics
            p = -math.expm1(-1.0 / b)
            return (rng.geometric(p, shape) - rng.geometric(p, shape)).astype(np.float64)
        return rng.laplace(0.0, b, shape)
    out = rng.normal(0.0, b, shape)
    return np.round(out) if nz.integer else out


def _interval(lo: float, hi: float) -> list[float]:
    return [float(lo), float(hi)]


def _base(details: dict) -> dict:
    out = {"kind": details["kind"], "mechanism": details["mechanism"]}
    out.update(details["cost"])
    out["max_rows_per_unit"] = details["max_rows_per_unit"]
    return out


def _grouped(details: dict, keys: list, values: list, cis: list) -> list[dict]:
    return [{"key": k, "value": v, "ci95": ci} for k, v, ci in zip(keys, values, cis)]


def additive(details: dict, noisy, nz: Noise) -> dict:
    """count / sum / histogram: one noisy number or vector."""
    h = nz.halfwidth()
    conv = int if nz.integer else float
    out = _base(details)
    out.update({"noise_scale": nz.scale, "sensitivity": nz.sensitivity})
    if details["kind"] == "histogram":
        hist = details["histogram"]
        out["column"] = details["column"]
        keys = hist["labels"]
        out["bins"] = "declared domain" if hist["type"] == "categorical" else "[a, b) edges, the last bin closed"
    elif details["group_by"]:
        keys = details["domain"]
        out["group_by"] = details["group_by"]
    else:
        out["value"] = conv(noisy)
        out["ci95"] = _interval(_floor(details, noisy, h), noisy + h)
        return out
    vals = [conv(v) for v in noisy]
    out["groups"] = _grouped(details, keys, vals, [_interval(_floor(details, v, h), v + h) for v in vals])
    return out


def _floor(details: dict, value, h):
    """An interval's low end: a count's starts at 0 (no count is below it: post-processing),
    or at its value if that was drawn below 0: the value is left as drawn, unbiased, and
    stays inside its interval."""
    lo = value - h
    return max(lo, min(value, 0)) if details["kind"] in ("count", "histogram") else lo


def ratio(details: dict, noisy: dict, nzs: dict[str, Noise], rng: np.random.Generator) -> dict:
    """mean / variance from noisy count, centred sum (and sum of squares)."""
    lo, hi = details["bounds"]
    mid, r = details["center"], details["radius"]
    kind = details["kind"]
    grouped = details["group_by"] is not None
    # By name, never by position: the plan comes back from the database, and PostgreSQL's
    # jsonb does not keep key order ("sum" before "count"), which once swapped them.
    comps = list(nzs)
    arrays = {name: np.atleast_1d(np.asarray(noisy[name], dtype=np.float64)) for name in comps}
    g = len(arrays["count"])
    sims = max(200, min(SIMULATIONS, SIM_BUDGET // max(g, 1)))

    def estimate(parts):
        n = np.maximum(parts["count"], 1.0)
        m = parts["sum"] / n
        if kind == "mean":
            return np.clip(mid + m, lo, hi)
        return np.clip(parts["sum_of_squares"] / n - m * m, 0.0, r * r)

    centre = _feasible(arrays, r)
    point = estimate(centre)
    simulated = {name: centre[name][:, None] + _simulate(nzs[name], (g, sims), rng) for name in comps}
    boot = estimate(simulated)
    los, his = np.percentile(boot, [2.5, 97.5], axis=1)
    # Where the estimate is clipped (at a bound, or a variance at 0) in more than 2.5% of the
    # simulations, the percentile there is the clip, not an end: that side goes to the
    # clip's bound. Where the count could be under 1 (its simulations' 2.5th percentile),
    # the estimate says nothing: the whole range. (At epsilon 0.01 on 300 rows a
    # variance's interval was [0, 0] in 9 of 40 runs and missed the value in 11.)
    floor_, top = (lo, hi) if kind == "mean" else (0.0, r * r)
    empty = np.percentile(simulated["count"], 2.5, axis=1) < 1.0
    los = np.where(empty | ((boot <= floor_).mean(axis=1) >= 0.025), floor_, los)
    his = np.where(empty | ((boot >= top).mean(axis=1) >= 0.025), top, his)
    # the value inside its interval, as a count's (a probe found 0.5% of variances outside)
    los, his = np.minimum(los, point), np.maximum(his, point)
    out = _base(details)
    out["noise_scale"] = {name: nzs[name].scale for name in comps}
    out["sensitivity"] = {name: nzs[name].sensitivity for name in comps}
    if grouped:
        out["group_by"] = details["group_by"]
        out["groups"] = _grouped(details, details["domain"], [float(v) for v in point],
                                 [_interval(a, b) for a, b in zip(los, his)])
    else:
        out["value"] = float(point[0])
        out["ci95"] = _interval(los[0], his[0])
        out["noisy_count"] = int(arrays["count"][0])
    return out


def _feasible(arrays: dict, r: float) -> dict:
    """The noisy parts moved to the nearest values some table could have given (a count of at
    least one, a centred sum within r per row, a sum of squares between the sum's square over
    the count and r squared per row): the value's parts and where the simulations start (from
    the raw parts, 0.5% of variances fell outside their interval). From a sum of squares drawn
    far below zero every simulation's variance clipped at 0: the interval was [0, 0] about once
    in 300 runs at epsilon 0.01 on 300 rows whose variance is 8.4."""
    out = dict(arrays)
    n = np.maximum(arrays["count"], 1.0)
    out["sum"] = np.clip(arrays["sum"], -r * n, r * n)
    if "sum_of_squares" in arrays:
        out["sum_of_squares"] = np.clip(arrays["sum_of_squares"], out["sum"] ** 2 / n, r * r * n)
    return out


def quantile_interval(details: dict, pick: float, ends) -> list[float] | None:
    """The 95% interval of a quantile: the two end picks, one grid step further out each
    (a candidate grid resolves no finer), holding the answer, inside the declared bounds."""
    if ends is None:
        return None
    qd = details["quantile"]
    g = qd["grid"]
    step = (g["upper"] - g["lower"]) / max(g["count"] - 1, 1)
    # Each end's bound holds where some candidate's score reaches -t (+t): the lowest
    # candidate's score is -q n, the highest's (1 - q) n. Past that (a small epsilon on few
    # rows: t of thousands of ranks on 300 rows) the shifted score's best is itself off by
    # the difference, and the ends fell anywhere (at epsilon 0.01, 9 of 40 intervals missed
    # the median): the whole grid, as with registered rows (an upper bound) there. An end
    # picked on the wrong side of the answer says nothing of that side either: its bound.
    # ends past the grid go to the declared bounds, which whole steps on an integer column may
    # stop short of (0, 4, 8 on [0, 10]: a column all 10 got [0, 8], a probe)
    b_lo, b_hi = details.get("bounds") or (g["lower"], g["upper"])
    t = qd["interval"]["shift"] / qd["alpha_den"]
    n = details.get("n_rows", 0)
    lo, hi, *held = ends  # (lo, hi, lo confirmed, hi confirmed) since the checks (execute._ends_held)
    held = held or [True, True]
    iv = qd.get("interval", {})
    decimals = 0 if iv.get("integer") else iv.get("decimals")
    if decimals is not None:
        # a declared-integer column's quantile is a whole number: a pick between two of them
        # (on a tie's plateau) stands for the whole numbers around it; likewise on decimals
        lo, hi = _rounded_out(lo, decimals, math.floor), _rounded_out(hi, decimals, math.ceil)
    if t > qd["q"] * n or lo > pick or not held[0]:
        lo = b_lo
    if t > (1 - qd["q"]) * n or hi < pick or not held[1]:
        hi = b_hi
    return _interval(max(b_lo, min(lo - step, pick)), min(b_hi, max(hi + step, pick)))


def _rounded_out(x: float, decimals: int, to) -> float:
    """``x`` rounded ``to`` (floor, ceil) its ``decimals``; as it is where a float holds no
    finer step (past 2^53 units: 1e300 x 10^9 overflowed, a charged failure)."""
    scaled = x * 10 ** decimals
    return to(scaled) / 10 ** decimals if abs(scaled) < 2**53 else x


def quantile(details: dict, picks: list[float], ends: list | None = None) -> dict:
    qd = details["quantile"]
    m = qd["grid"]["count"]
    cis = [quantile_interval(details, p, ends[i] if ends else None) for i, p in enumerate(picks)]
    out = _base(details)
    out.update({
        "q": qd["q"],
        "q_used": qd["alpha_num"] / qd["alpha_den"],  # OpenDP's: q in 10,000ths, truncated
        "noise_scale": qd["scale"],
        "candidates": qd["grid"],
        "rank_error95": qd["scale"] * math.log(20 * m) / qd["alpha_den"],
    })
    if details["group_by"]:
        out["group_by"] = details["group_by"]
        out["groups"] = _grouped(details, details["domain"], picks, cis)
    else:
        out["value"] = picks[0]
        out["ci95"] = cis[0]
    return out
