"""Sensitivity and cost: from a validated query to the mechanism event, before any data.

Neighbouring datasets differ by one privacy unit (add/remove), which holds at most
``k = max_rows_per_unit`` rows after contribution bounding (k = 1 when every row is its
own unit). Numeric values are clamped to the declared [lower, upper]; M = max(|lower|,
|upper|); mean and variance work on centred values y = x - (lower + upper) / 2, clamped
to [-R, R] with R = (upper - lower) / 2. Sensitivities (L1 and L2 alike, since a unit's
rows can only add up):

- count / histogram / grouped count: k. A unit changes at most k cells by 1 each, so the
  L1 norm is k and the L2 norm is at most k (sqrt(k) if its rows fell in k distinct
  cells, but k is the bound for every split, so both are stated as k).
- sum (grouped or not): k * M. A unit's rows split across groups still move the sum
  vector by at most k * M in L1, hence also in L2.
- mean: count (k) and centred sum (k * R), each with half of the budget.
- variance: count (k), centred sum (k * R), centred sum of squares (k * R^2), each
  with a third of the budget.
- quantile: the exponential mechanism over a grid of candidates in [lower, upper], on
  OpenDP's integer scores; a unit is k rows of symmetric distance, and OpenDP's map of
  ``make_quantile_score_candidates >> make_noisy_max`` at d_in = k is the charge. Grouped
  quantiles reuse that scale per group: a unit with k_g rows in group g costs
  sum_g 2 k_g c / s <= 2 k c / s, the ungrouped charge.

Costs come from OpenDP's privacy maps of the exact measurements the run builds
(noise.py). Events (accounting.events):

- laplace:  ``{"kind": "laplace", "epsilon": map(d_in)}``
- gaussian: ``{"kind": "gaussian", "noise_multiplier": 1 / sqrt(2 * rho)}`` with
  rho = map(d_in) (zCDP; noise std = multiplier x L2 sensitivity)
- quantile: ``{"kind": "epsilon_delta", "epsilon": map(k), "delta": 0}``, the sum of three
  such chains, the answer (7/16 of the budget) and the two ends of its interval (7/32
  each), and of the two ends' checks, OpenDP discrete Laplace measurements (1/16 each;
  report.py)
- mean / variance: ``{"kind": "composed", "events": [...]}`` of their components.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from accounting.events import MAX_NOISE_MULTIPLIER
from engines.types import DatasetMeta, EngineRequest, Plan, PlanError

from . import noise
from .params import Query, validate

DETAILS_VERSION = 1
MAX_INTEGER_SCALE = 1e12  # count noise beyond this says nothing and nears the int64 range
# Every released number (and, for a variance, its square) must stay finite in float64: an
# answer of inf or NaN is not JSON and would fail the run after the data was read (charged).
# So no noise scale beyond this, and no sum that could exceed it (rows x sensitivity).
MAX_MAGNITUDE = 1e150
#: a quantile's budget: the answer's share, and each end of its 95% interval's (report.py)
#: and each end's check (report.py: an end not confirmed on its side is the grid's bound)
#: (chosen side by side on three unseen columns at epsilon 1, medians of 80 runs: the
#: picks at 3/16 each gave intervals 18.5% of the range wide where 1/4 gave 12.5% before the
#: checks; 7/16, 7/32 and 1/16 give 15.3%, an end widened to the bound in 3 of 80)
POINT_SHARE, END_SHARE, CHECK_SHARE = 0.4375, 0.21875, 0.0625


def _times(k: int, x: float) -> float:
    """k * x rounded up (a sensitivity must never be understated)."""
    out = k * x
    if not math.isfinite(out):  # bounds near the float range: r * r overflows (refused by make_plan)
        return math.inf
    if Fraction(out) < k * Fraction(x):
        out = math.nextafter(out, math.inf)
    return out


def components(q: Query) -> list[tuple[str, float | int, bool]]:
    """(name, sensitivity, integer) of every noisy quantity the query releases."""
    k = q.k
    if q.kind in ("count", "histogram"):
        return [("count", k, True)]
    lo, hi = q.bounds
    if q.kind == "sum":
        return [("sum", _times(k, max(abs(lo), abs(hi))), False)]
    r = (hi - lo) / 2
    out = [("count", k, True), ("sum", _times(k, r), False)]
    if q.kind == "variance":
        out.append(("sum_of_squares", _times(k, r * r), False))
    return out


def _event(mechanism: str, cost: float) -> dict:
    if mechanism == "laplace":
        return {"kind": "laplace", "epsilon": cost}
    return {"kind": "gaussian", "noise_multiplier": 1.0 / math.sqrt(2.0 * cost)}


def _budget_error(q: Query, e: Exception) -> PlanError:
    which = {"halfwidth": "accuracy"}.get(q.budget[0], q.budget[0])
    return PlanError(f"cannot calibrate the noise to {which}={q.budget[1]!r}: {e}",
                     {which: "out of the range the mechanism can calibrate to"})


def make_plan(request: EngineRequest, dataset: DatasetMeta) -> Plan:
    if request.kind == "query":  # several aggregates, composite groups, post-processing (query.py)
        from .query import make_plan as make_query_plan

        return make_query_plan(request, dataset)
    q = validate(request.kind, request.params, dataset)
    event, details = plan_validated(q, dataset)
    columns = list(dict.fromkeys(c for c in [q.column, q.group_by, *where_columns(q.where)] if c))
    return Plan(event=event, columns=columns, details=details)


def where_columns(where: list[dict]) -> list[str]:
    """The columns a (validated) where list reads, nested OR / NOT included."""
    out = []
    for p in where:
        if "or" in p:
            for branch in p["or"]:
                out += where_columns(branch)
        elif "not" in p:
            out += where_columns(p["not"])
        else:
            out.append(p["column"])
            if isinstance(p.get("value"), dict):  # compared with another column
                out.append(p["value"]["column"])
    return out


def plan_validated(q: Query, dataset: DatasetMeta) -> tuple[dict, dict]:
    """The event and the run's details of a validated query."""
    if q.bounds is not None and q.kind != "quantile":
        largest = max(dataset.n_rows, 1) * max(sens for _, sens, _ in components(q))
        if not largest <= MAX_MAGNITUDE:
            raise PlanError(f"the declared bounds of {q.column!r} are too wide: {dataset.n_rows} rows could sum "
                            f"to {largest:.3g}, too close to the range of 64-bit floats (rows x bound, squared "
                            f"for a variance, must stay under {MAX_MAGNITUDE:.0e})",
                            {"column": "declared bounds too wide"})
    details = {
        "version": DETAILS_VERSION,
        "kind": q.kind,
        "mechanism": q.mechanism,
        "max_rows_per_unit": q.k,
        "unit_column": dataset.unit_column,
        "n_rows": int(dataset.n_rows),
        "column": q.column,
        "bounds": list(q.bounds) if q.bounds else None,
        "where": q.where + q.non_null,
        "distinct_of": q.distinct_of,
        "group_by": q.group_by,
        "domain": q.domain,
        "histogram": q.hist,
    }
    grouped = q.group_by is not None or q.kind == "histogram"
    try:
        if q.kind == "quantile":
            event = _plan_quantile(q, details)
        else:
            event = _plan_noise(q, details, grouped)
    except (ValueError, ArithmeticError, noise.OpenDPError) as e:  # overflow, underflow to zero
        raise _budget_error(q, e) from None
    return event, details


def _plan_noise(q: Query, details: dict, vector: bool) -> dict:
    comps = components(q)
    which, amount = q.budget
    plans = {}
    for name, sens, integer in comps:
        if which == "halfwidth":
            nz, cost = noise.for_accuracy(q.mechanism, sens, amount, integer=integer, vector=vector)
        else:
            nz, cost = noise.calibrate(q.mechanism, sens, amount / len(comps), integer=integer, vector=vector)
        if not (math.isfinite(cost) and cost > 0):
            raise ValueError(f"OpenDP maps this noise to a cost of {cost}")
        event = _event(q.mechanism, cost)
        if event.get("noise_multiplier", 0.0) > MAX_NOISE_MULTIPLIER:
            # (a fuzzer's sum over bounds of 1e-160 at a halfwidth of 0.5: a noise 3e161 times
            # its sensitivity, an event the ledger refuses; a 400, not a 500)
            raise ValueError(f"the noise would be {event['noise_multiplier']:.3g} times the sensitivity, more "
                             f"than the {MAX_NOISE_MULTIPLIER:.0e} an event may state: ask for a smaller halfwidth "
                             "or a larger budget")
        if integer and nz.scale > MAX_INTEGER_SCALE:
            raise ValueError(f"the noise scale would be {nz.scale:.3g}: counts would be pure noise "
                             "(and overflow 64-bit integers)")
        if not nz.scale <= MAX_MAGNITUDE:
            raise ValueError(f"the noise scale would be {nz.scale:.3g}: the answer would be pure noise "
                             "(and overflow 64-bit floats)")
        plans[name] = {**nz.to_dict(), "cost": cost, "event": event}
    total = sum(p["cost"] for p in plans.values())
    if not math.isfinite(total):
        raise ValueError(f"the components' costs add up to {total}")
    details["components"] = plans
    details["cost"] = {"epsilon" if q.mechanism == "laplace" else "rho": total}
    if q.bounds and q.kind in ("mean", "variance"):
        lo, hi = q.bounds
        details["center"], details["radius"] = (lo + hi) / 2, (hi - lo) / 2
    events = [p["event"] for p in plans.values()]
    return events[0] if len(events) == 1 else {"kind": "composed", "events": events}


def candidate_grid(lower: float, upper: float, count: int) -> np.ndarray:
    return np.linspace(lower, upper, count)


def grid_span(lower: float, upper: float, count: int, integer: bool) -> tuple[float, float, int]:
    """The candidate grid's (lower, upper, count). On a column declared ``integer`` every
    candidate is a whole number: all of them when they are at most ``count``, else whole
    steps; a grid of fractions put every pick on tied integer data strictly between two
    integers, on either side of the true one (a probe: the median of children 1.2-1.8 at
    epsilon 1e5 where SQL says 2). Whole steps may stop short of the upper bound by less than a
    step (the interval reaches the declared bounds: ``report.quantile_interval``)."""
    if not integer or not (math.isfinite(lower) and math.isfinite(upper)):
        return lower, upper, count
    lo, hi = math.ceil(lower), math.floor(upper)
    if hi - lo < 1:  # (a probe's [2, 2.9] got a grid of fractions)
        raise PlanError(f"at most one whole number lies between the bounds [{lower}, {upper}] of a column declared "
                        "integer: a quantile there says nothing; declare bounds at least 1 apart",
                        {"bounds": "hold at most one whole number"})
    if count < 2:
        return lower, upper, count
    step = max(1, math.ceil((hi - lo) / (count - 1)))
    n = (hi - lo) // step + 1
    return float(lo), float(lo + step * (n - 1)), int(n)


def _plan_quantile(q: Query, details: dict) -> dict:
    lo, hi, count = grid_span(*q.bounds, q.candidates, q.integer)
    grid = candidate_grid(lo, hi, count)
    if not np.all(np.isfinite(grid)) or not np.isfinite(hi - lo):
        raise PlanError("declared bounds too wide: the candidate grid between them overflows",
                        {"bounds": "too wide for a quantile's candidate grid"})
    if not np.all(np.diff(grid) > 0):
        raise PlanError("the candidate grid is not strictly increasing: the bounds are too close for "
                        f"{q.candidates} candidates", {"candidates": "too many for the column's range"})
    epsilon = q.budget[1]
    # 7/16 of the budget for the answer, 7/32 for each end of its interval and 1/16 for each
    # end's check (report.py)
    scale, score_sens, cost = noise.quantile_chain_cost(grid.tolist(), q.q, q.k, epsilon * POINT_SHARE)
    e_scale, _, e_cost = noise.quantile_chain_cost(grid.tolist(), q.q, q.k, epsilon * END_SHARE)
    if not max(scale, e_scale) <= MAX_MAGNITUDE:  # the pick would be uniform, and its rank error overflow
        raise ValueError(f"the noise scale would be {max(scale, e_scale):.3g}: the pick would be pure noise")
    num, den = noise.quantile_alpha(q.q)
    shift = math.ceil(e_scale * math.log(2 * 20 * count))  # each end errs by more w.p. <= 2.5%
    # each end's side of the quantile, confirmed by a noisy count of the rows past it (report.py)
    check, c_cost = noise.calibrate("laplace", int(q.k) * max(num, den - num), epsilon * CHECK_SHARE,
                                    integer=True, vector=True)
    total = cost + 2 * e_cost + 2 * c_cost
    details["quantile"] = {
        "q": q.q, "alpha_num": num, "alpha_den": den,
        "grid": {"lower": lo, "upper": hi, "count": count},
        "scale": scale, "score_sensitivity": score_sens, "epsilon": cost,
        "interval": {"scale": e_scale, "epsilon": e_cost, "shift": shift, "integer": q.integer,
                     "decimals": q.decimals,
                     "check": {**check.to_dict(), "epsilon": c_cost, "margin": check.halfwidth()}},
    }
    details["cost"] = {"epsilon": total}
    return {"kind": "epsilon_delta", "epsilon": total, "delta": 0.0}
