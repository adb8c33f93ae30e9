"""Planning a synthesis request: the event the whole run costs, before any data is read.

**MST** (McKenna, Miklau, Sheldon 2021), over d columns (numerics cut into ``bins``
equal-width bins of their declared range, plus a null cell; categoricals over their
declared domain plus an "other/null" cell):

1. measure every one-way marginal with the discrete Gaussian (d releases);
2. select d - 1 pairs forming a maximum spanning tree, each round by report-noisy-max
   with exponential noise (the exponential mechanism; pure epsilon each) over the L1
   error of the independence model on the pairs still joining two components;
3. measure the selected two-way marginals with the discrete Gaussian (d - 1 releases).

A privacy unit adds or removes at most k = ``max_rows_per_unit`` rows, so each marginal
vector moves by at most k in L2 and each selection score by at most k. The event is

    composed[ self_composed(gaussian(z1), d), self_composed(epsilon_delta(e_sel), d - 1),
              self_composed(gaussian(z2), d - 1) ]

with the budget split 20% / 10% / 70% of a zCDP rho (the selection's pure epsilon is
counted at its randomised-response RDP curve, which is conservative), and rho the
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
SHARES = {"one_way": 0.2, "select": 0.1, "two_way": 0.7}
MIN_SIGNAL = 10.0  # refuse when the one-way noise exceeds a tenth of the table


def _rdp_epsilon(event: dict, delta: float) -> float:
    from governance.accounting import parse_event, rdp

    return rdp.compose([parse_event(event)], delta).epsilon


def _mst_parts(rho: float, d: int, k: int) -> dict:
    """Noise scales for a total zCDP ``rho`` (before OpenDP's nudging)."""
    rho1 = SHARES["one_way"] * rho / d
    rho2 = SHARES["two_way"] * rho / (d - 1)
    eps_sel = math.sqrt(2.0 * SHARES["select"] * rho / (d - 1))
    return {"sigma1": k / math.sqrt(2 * rho1), "sigma2": k / math.sqrt(2 * rho2), "eps_sel": eps_sel}


def _mst_event(z1: float, eps_sel: float, z2: float, d: int) -> dict:
    return {"kind": "composed", "events": [
        {"kind": "self_composed", "event": {"kind": "gaussian", "noise_multiplier": z1}, "count": d},
        {"kind": "self_composed", "event": {"kind": "epsilon_delta", "epsilon": eps_sel, "delta": 0.0},
         "count": d - 1},
        {"kind": "self_composed", "event": {"kind": "gaussian", "noise_multiplier": z2}, "count": d - 1}]}


def _plan_mst(spec: Spec) -> tuple[dict, dict]:
    d, k = len(spec.columns), spec.max_rows_per_unit

    def event_of(rho):
        p = _mst_parts(rho, d, k)
        return _mst_event(p["sigma1"] / k, p["eps_sel"], p["sigma2"] / k, d)

    lo, hi = 1e-8, 1e4  # rho: eps(lo) <= target < eps(hi)
    if _rdp_epsilon(event_of(lo), spec.delta) > spec.epsilon:
        raise PlanError("epsilon is too small for MST", {"epsilon": "too small for MST"})
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if _rdp_epsilon(event_of(mid), spec.delta) <= spec.epsilon:
            lo = mid
        else:
            hi = mid
    parts = _mst_parts(lo, d, k)
    one, c1 = opendp_noise.calibrate("gaussian", k, (k / parts["sigma1"]) ** 2 / 2, integer=True, vector=True)
    two, c2 = opendp_noise.calibrate("gaussian", k, (k / parts["sigma2"]) ** 2 / 2, integer=True, vector=True)
    select_scale = 2.0 * k / parts["eps_sel"]
    eps_sel = select_cost(select_scale, k)
    event = _mst_event(1 / math.sqrt(2 * c1), eps_sel, 1 / math.sqrt(2 * c2), d)
    if one.scale > spec.n_train_units / MIN_SIGNAL:
        raise PlanError(
            f"epsilon {spec.epsilon:g} is too small for MST on {spec.n_train_units:,} privacy units and {d} columns: "
            f"the noise on each one-way marginal (sd {one.scale:,.0f}) would exceed a tenth of the table; raise "
            "epsilon, synthesize fewer columns or use fewer bins",
            {"epsilon": f"too small for MST here (one-way noise sd {one.scale:,.0f})"})
    details = {"one_way": one.to_dict(), "two_way": two.to_dict(), "select_scale": select_scale,
               "select_epsilon": eps_sel, "shares": SHARES}
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
