"""Planning a synthesis request: the event the whole run costs, before any data is read.

**MST** (McKenna, Miklau, Sheldon 2021), over d columns (numerics cut into ``bins``
equal-width bins of their declared range, plus a null cell; categoricals over their
declared domain plus an "other/null" cell):

1. measure every one-way marginal with the discrete Gaussian (d releases);
2. select d - 1 pairs forming a maximum spanning tree, each round by report-noisy-max
   with exponential noise (the exponential mechanism; pure epsilon each) over the L1
   error of the independence model on the pairs still joining two components;
3. measure the selected two-way marginals with the discrete Gaussian (d - 1 releases);
4. measure each numeric column's fine histogram (one cell per integer, or 10 per bin)
   with the discrete Gaussian (one release per numeric column): decoding draws values
   inside a bin from it (see encoding.py).

A privacy unit adds or removes at most k = ``max_rows_per_unit`` rows, so each marginal
vector moves by at most k in L2 and each selection score by at most k. The event is

    composed[ self_composed(gaussian(z1), d), self_composed(epsilon_delta(e_sel), d - 1),
              self_composed(gaussian(z2), d - 1), self_composed(gaussian(zf), m) ]

(m numeric columns) with the budget split 20% / 10% / 60% / 10% of a zCDP rho (without
numeric columns the fine share goes to the two-way marginals; the selection's pure
epsilon is counted at its randomised-response RDP curve, which is conservative), and rho the
largest for which the service's RDP accountant charges at most the requested epsilon
at delta. Every noise scale and its cost come from OpenDP (its privacy maps).

**VAE**: DP-SGD (engines/dpsgd) on a tabular VAE: ``subsampled_gaussian(q, z, steps)``
with z calibrated to epsilon exactly as the DP-SGD engine does.
"""

from __future__ import annotations

import math

from engines.aggregates import noise as opendp_noise
from engines.types import DatasetMeta, EngineRequest, Plan, PlanError

from .params import Spec, validate

DETAILS_VERSION = 1
SHARES = {"one_way": 0.2, "select": 0.1, "two_way": 0.6, "fine": 0.1}
MIN_SIGNAL = 10.0  # refuse when the one-way noise exceeds a tenth of the table


def _rdp_epsilon(event: dict, delta: float) -> float:
    """What the ledger charges for ``event`` under RDP: its curve on the stored grid of
    orders (``accounting.base.compose_events``), not ``rdp.compose``'s off-grid refinement,
    which can be lower; calibrated to the refined number, a run would be charged (and
    reported) slightly above the epsilon the analyst asked for."""
    from accounting import parse_event, rdp
    from accounting.base import compose_events

    return compose_events(rdp, [parse_event(event)], delta).epsilon


def _mst_parts(rho: float, d: int, m: int, k: int) -> dict:
    """Noise scales for a total zCDP ``rho`` (before OpenDP's nudging)."""
    fine = SHARES["fine"] if m else 0.0
    rho1 = SHARES["one_way"] * rho / d
    rho2 = (SHARES["two_way"] + SHARES["fine"] - fine) * rho / (d - 1)
    eps_sel = math.sqrt(2.0 * SHARES["select"] * rho / (d - 1))
    sigma_f = k / math.sqrt(2 * fine * rho / m) if m else None
    return {"sigma1": k / math.sqrt(2 * rho1), "sigma2": k / math.sqrt(2 * rho2), "eps_sel": eps_sel,
            "sigma_f": sigma_f}


def _gaussians(z: float, count: int) -> dict:
    return {"kind": "self_composed", "event": {"kind": "gaussian", "noise_multiplier": z}, "count": count}


def _mst_event(z1: float, eps_sel: float, z2: float, zf: float | None, d: int, m: int) -> dict:
    parts = [_gaussians(z1, d),
             {"kind": "self_composed", "event": {"kind": "epsilon_delta", "epsilon": eps_sel, "delta": 0.0},
              "count": d - 1},
             _gaussians(z2, d - 1)]
    if m:
        parts.append(_gaussians(zf, m))
    return {"kind": "composed", "events": parts}


def _plan_mst(spec: Spec) -> tuple[dict, dict]:
    d, k = len(spec.columns), spec.max_rows_per_unit
    m = sum(1 for c in spec.columns if c["type"] == "numeric")

    def event_of(rho):
        p = _mst_parts(rho, d, m, k)
        return _mst_event(p["sigma1"] / k, p["eps_sel"], p["sigma2"] / k, p["sigma_f"] and p["sigma_f"] / k, d, m)

    lo, hi = 1e-8, 1e4  # rho: eps(lo) <= target < eps(hi)
    if _rdp_epsilon(event_of(lo), spec.delta) > spec.epsilon:
        raise PlanError("epsilon is too small for MST", {"epsilon": "too small for MST"})
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if _rdp_epsilon(event_of(mid), spec.delta) <= spec.epsilon:
            lo = mid
        else:
            hi = mid
    parts = _mst_parts(lo, d, m, k)

    def noise(sigma):
        return opendp_noise.calibrate("gaussian", k, (k / sigma) ** 2 / 2, integer=True, vector=True)

    (one, c1), (two, c2) = noise(parts["sigma1"]), noise(parts["sigma2"])
    fine, cf = noise(parts["sigma_f"]) if m else (None, None)
    select_scale = 2.0 * k / parts["eps_sel"]
    eps_sel = select_cost(select_scale, k)
    event = _mst_event(1 / math.sqrt(2 * c1), eps_sel, 1 / math.sqrt(2 * c2), cf and 1 / math.sqrt(2 * cf), d, m)
    if one.scale > spec.n_train_units / MIN_SIGNAL:
        raise PlanError(
            f"epsilon {spec.epsilon:g} is too small for MST on {spec.n_train_units:,} privacy units and {d} columns: "
            f"the noise on each one-way marginal (sd {one.scale:,.0f}) would exceed a tenth of the table; raise "
            "epsilon, synthesize fewer columns or use fewer bins",
            {"epsilon": f"too small for MST here (one-way noise sd {one.scale:,.0f})"})
    details = {"one_way": one.to_dict(), "two_way": two.to_dict(), "fine": fine and fine.to_dict(),
               "select_scale": select_scale, "select_epsilon": eps_sel, "shares": SHARES}
    return event, details


def select_cost(scale: float, k: int) -> float:
    """OpenDP's epsilon for one report-noisy-max round at score sensitivity k."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    m = dp.m.make_noisy_max(dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.linf_distance(T=float),
                            dp.max_divergence(), scale=float(scale))
    return float(m.map(float(k)))


def _plan_vae(spec: Spec) -> tuple[dict, dict]:
    from engines.dpsgd import calibrate

    v = spec.vae
    q, per_epoch = calibrate.sampling(spec.n_train_units, v["batch_size"], v["epochs"])
    steps = per_epoch * v["epochs"]
    try:
        z = calibrate.noise_multiplier(spec.epsilon, spec.delta, q, steps)
    except calibrate.CalibrationError as e:
        raise PlanError(str(e), {"epsilon": str(e)}) from None
    return calibrate.run_event(q, z, steps, 0.0, 0), {"sample_rate": q, "noise_multiplier": z, "steps": steps,
                                                       "steps_per_epoch": per_epoch}


def make_plan(request: EngineRequest, ds: DatasetMeta) -> Plan:
    spec = validate(request.kind, request.params, ds)
    event, method_details = _plan_mst(spec) if spec.method == "mst" else _plan_vae(spec)
    details = {"version": DETAILS_VERSION, "spec": spec.to_dict(), spec.method: method_details,
               "planned_epsilon": _rdp_epsilon(event, spec.delta)}
    return Plan(event=event, columns=spec.names, details=details)
