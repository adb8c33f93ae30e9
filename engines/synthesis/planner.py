"""Planning a synthesis request: the event the whole run costs, before any data is read.

**MST** (McKenna, Miklau, Sheldon 2021), over d columns measured on their cells
(``encoding``: from the declared schema only; a numeric column one cell per grid value
when its ``integer`` / ``decimals`` grid has at most 256 values, else 256 equal-width
cells; a categorical column one per declared value; a null cell unless ``nullable:
false``):

1. measure every one-way marginal with the discrete Gaussian: one histogram per column,
   or, for a numeric column of more than 32 cells, one per level of a tree of blocks of
   4^j cells (n1 releases in all, ``encoding.one_way_releases``); mst.py turns them into
   a private partition and compresses it (post-processing);
2. select d - 1 pairs forming a maximum spanning tree, each round by report-noisy-max
   with exponential noise (the exponential mechanism; pure epsilon each) over the L1
   error of the independence model on the pairs still joining two components, less
   the L1 the pair's measurement noise is expected to add (sqrt(2 / pi) sigma2 per
   cell, as AIM's selection: public, from the compressed cells);
3. measure the selected two-way marginals (on the compressed cells) with the discrete
   Gaussian (d - 1 releases);
4. measure the grid histogram of each numeric column whose grid has more values than
   cells, or that has no declared grid (on a candidate grid from its declared range)
   (m releases; a grid of more than 200,000 values on its first 10^k times coarser
   grid of at most 200,000, with the gaps between its values): its heavy grid values
   and gaps are drawn with their counts (see encoding.py); a declared grid coarsened at
   most 1,000 times (``encoding.refines_gaps``; not on a distributed dataset) has one
   more release, of the declared values inside the heavy gaps the first one shows (m
   counts both), where it pays (``_refinement_pays``).

A privacy unit adds or removes at most k = ``max_rows_per_unit`` rows, so each marginal
vector moves by at most k in L2 and each selection score by at most k. On a table with a
privacy-unit column, d counts one more column than was asked for: the bucket of each row's
unit's rows (``params.model_columns``), modelled like any categorical column and used to
tilt the fitted model by r / k before sampling (mst.tilt), so units with more than k rows
weigh what they weigh in the table (all rows of a unit share one bucket: a unit still
moves each marginal by at most k). The event is

    composed[ self_composed(gaussian(z1), n1), self_composed(epsilon_delta(e_sel), d - 1),
              self_composed(gaussian(z2), d - 1), self_composed(gaussian(zf), m) ]

with the budget split 60% / 10% / 20% / 10% of a zCDP rho (without grid histograms the
fine share goes to the two-way marginals; the selection's pure
epsilon is counted at its randomised-response RDP curve, which is conservative), and rho the
largest for which the service's RDP accountant charges at most the requested epsilon
at delta. Every noise scale and its cost come from OpenDP (its privacy maps).

With ``accountant: pld`` (when the dataset's officer allows ``pld_certification``, at
one row per privacy unit) rho is instead the largest for which the privacy loss
distribution certifies the run at the requested epsilon: the discrete Gaussians' exact
PLD (one row moves one cell of a marginal by 1) composed with randomised response for
each selection (``pld_epsilon``; the PLD code is engines/dpsgd/pld.py's). About 6-7% less
noise on every measurement at the same target. The run is one pre-planned mechanism
(its pairs are chosen as it goes, but every step's PLD is fixed in advance, for which
PLD composition holds), so PLD certifies it; the ledger still charges its event by the
RDP curve (above the target), since PLD is no privacy filter across adaptively chosen
requests. The plan records ``certified_by`` and ``certified_epsilon`` beside
``planned_epsilon`` (the charge).

**AIM** (aim.py): the same n1 one-way releases and m grid histograms as MST (their noise
fixed here), then adaptive rounds of exponential-mechanism selections and discrete-
Gaussian measurements whose number and scales the run chooses as it goes, within a zCDP
budget ``rounds_rho`` (a zCDP filter: it never spends more). The event is

    composed[ self_composed(gaussian(z1), n1), self_composed(gaussian(zf), m),
              subsampled_gaussian(q=1, z=1/sqrt(2 rounds_rho), steps=1) ]

the last part being rho-zCDP's RDP curve alpha * rho in the one event form every
accountant prices from its RDP curve (``_aim_event``). Budget: 60% one-way, 10% grid
histograms (when there are any), the rest the rounds, of the largest rho whose event the
ledger's RDP accountant charges at most the requested epsilon.

**VAE**: DP-SGD (engines/dpsgd) on a tabular VAE: ``subsampled_gaussian(q, z, steps)``
with z calibrated to epsilon exactly as the DP-SGD engine does.
"""

from __future__ import annotations

import math
from dataclasses import replace

from engines.aggregates import noise as opendp_noise
from engines.types import DatasetMeta, EngineRequest, Plan, PlanError

from .params import Spec, model_columns, validate, with_rows_per_unit

DETAILS_VERSION = 3  # 2: MST on cells with private compression, fine = grid histograms; 3: fine also without a grid
# The one-way share (MST's and AIM's): the one-way marginals set every column's cells (the
# private partition and compression) and every pair's margins, so their noise reaches every
# marginal the model answers. Measured on twelve public tables at epsilon 1 (bench/README.md,
# "Before that: 60% of the budget to the one-way marginals"): 0.35 -> 0.6 raised the overall
# accuracy by 0.003-0.052 on the six tables under 2,000 units, was level on CPS, loans and
# Fertility, and lost 0.006 / 0.014 (MST / AIM) on InstEval, whose unit reweighting is
# learnt from pairs; 0.5 there gave 0.950 / 0.952, 0.35 0.953 / 0.959. 0.7-0.8 lost on
# pairs elsewhere (Wage, loans).
SHARES = {"one_way": 0.6, "select": 0.1, "two_way": 0.2, "fine": 0.1}
MIN_SIGNAL = 10.0  # refuse when the one-way noise exceeds a tenth of the table


def _rdp_epsilon(event: dict, delta: float) -> float:
    """What the ledger charges for ``event`` under RDP: its curve on the stored grid of
    orders (``accounting.base.compose_events``), not ``rdp.compose``'s off-grid refinement,
    which can be lower; calibrated to the refined number, a run would be charged (and
    reported) slightly above the epsilon the analyst asked for."""
    from accounting import parse_event, rdp
    from accounting.base import compose_events

    return compose_events(rdp, [parse_event(event)], delta).epsilon


def _mst_parts(rho: float, d: int, m: int, k: int, n1: int | None = None) -> dict:
    """Noise scales for a total zCDP ``rho`` (before OpenDP's nudging)."""
    fine = SHARES["fine"] if m else 0.0
    rho1 = SHARES["one_way"] * rho / (n1 or d)
    rho2 = (SHARES["two_way"] + SHARES["fine"] - fine) * rho / (d - 1)
    eps_sel = math.sqrt(2.0 * SHARES["select"] * rho / (d - 1))
    sigma_f = k / math.sqrt(2 * fine * rho / m) if m else None
    return {"sigma1": k / math.sqrt(2 * rho1), "sigma2": k / math.sqrt(2 * rho2), "eps_sel": eps_sel,
            "sigma_f": sigma_f}


def _gaussians(z: float, count: int) -> dict:
    return {"kind": "self_composed", "event": {"kind": "gaussian", "noise_multiplier": z}, "count": count}


def _mst_event(z1: float, eps_sel: float, z2: float, zf: float | None, d: int, m: int,
               n1: int | None = None) -> dict:
    parts = [_gaussians(z1, n1 or d),
             {"kind": "self_composed", "event": {"kind": "epsilon_delta", "epsilon": eps_sel, "delta": 0.0},
              "count": d - 1},
             _gaussians(z2, d - 1)]
    if m:
        parts.append(_gaussians(zf, m))
    return {"kind": "composed", "events": parts}


def _measured(rho: float, d: int, m: int, k: int, n1: int | None = None) -> dict:
    """The noise MST uses at zCDP ``rho``: OpenDP's discrete Gaussians for the one-way,
    two-way and fine measurements (each with its cost, OpenDP's rho after nudging) and
    the report-noisy-max scale and epsilon of each selection round."""
    parts = _mst_parts(rho, d, m, k, n1)

    def noise(sigma):
        return opendp_noise.calibrate("gaussian", k, (k / sigma) ** 2 / 2, integer=True, vector=True)

    select_scale = 2.0 * k / parts["eps_sel"]
    return {"one": noise(parts["sigma1"]), "two": noise(parts["sigma2"]),
            "fine": noise(parts["sigma_f"]) if m else (None, None),
            "select_scale": select_scale, "select_epsilon": select_cost(select_scale, k)}


def pld_epsilon(meas: dict, d: int, m: int, delta: float, interval: float | None = None,
                n1: int | None = None) -> float:
    """The whole MST run's epsilon at ``delta`` certified by PLD (one row per unit): d
    one-way, d - 1 two-way and m fine discrete-Gaussian measurements and d - 1 pure-DP
    selections, composed by ``engines.dpsgd.pld.composition_epsilon``."""
    from engines.dpsgd import pld

    gaussians = [(meas["one"][0].scale, n1 or d), (meas["two"][0].scale, d - 1)]
    if m:
        gaussians.append((meas["fine"][0].scale, m))
    return pld.composition_epsilon(gaussians, [(meas["select_epsilon"], d - 1)], delta,
                                   pld.INTERVAL if interval is None else interval)


def _largest_rho(event_of, spec: Spec, method: str) -> float:
    """The largest zCDP rho (bisected on a log scale in [1e-8, 1e4]) whose event the
    ledger's RDP accountant charges at most the requested epsilon."""
    lo, hi = 1e-8, 1e4  # rho: eps(lo) <= target < eps(hi)
    if _rdp_epsilon(event_of(lo), spec.delta) > spec.epsilon:
        raise PlanError(f"epsilon is too small for {method}", {"epsilon": f"too small for {method}"})
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if _rdp_epsilon(event_of(mid), spec.delta) <= spec.epsilon:
            lo = mid
        else:
            hi = mid
    return lo


def _pld_rho(spec: Spec, rho_rdp: float, d: int, m: int, n1: int | None = None) -> tuple[float, float]:
    """(rho, PLD epsilon): the largest zCDP rho (to 0.2%) whose run PLD certifies at the
    requested epsilon. Searched as the noise factor x = 1 / sqrt(rho) (noise grows with
    x) from RDP's answer (PLD never needs more noise) down to a quarter of it."""
    from engines.dpsgd import pld

    memo: dict = {}

    def meas(x):
        if x not in memo:
            memo[x] = _measured(1.0 / (x * x), d, m, 1, n1)
        return memo[x]

    def eps(x):
        return pld_epsilon(meas(x), d, m, spec.delta, n1=n1)

    def coarse(x):
        return pld_epsilon(meas(x), d, m, spec.delta, pld.COARSE_INTERVAL, n1)

    top = 1.0 / math.sqrt(rho_rdp)
    if eps(top) > spec.epsilon:
        raise PlanError(f"epsilon {spec.epsilon:g} is too small to certify this MST run under PLD; use rdp",
                        {"accountant": "epsilon too small to certify under PLD; use rdp"})
    x = pld.smallest_within(eps, coarse, spec.epsilon, top, top / 4)
    return 1.0 / (x * x), eps(x)


def _columns(spec: Spec) -> str:
    """The columns a refusal names: the requested ones, and the model's bucket column."""
    n = len(spec.columns)
    return f"{n} column{'s' if n != 1 else ''}" + (" (and the bucket of each unit's rows)" if spec.unit_weighting
                                                   else "")


def _refuse_too_little_signal(method: str, spec: Spec, sd: float) -> None:
    """A PlanError when the one-way marginals' noise sd is over a tenth of the training units."""
    limit = spec.n_train_units / MIN_SIGNAL
    if sd > limit:
        raise PlanError(
            f"epsilon {spec.epsilon:g} is too small for {method} on {spec.n_train_units:,} privacy units and "
            f"{_columns(spec)}: the noise on each one-way marginal (sd {sd:,.3g}) would exceed a tenth of the "
            f"training units ({limit:,.3g}); raise epsilon or synthesize fewer columns"
            + (" (unit_weighting false drops the bucket column)" if spec.unit_weighting else "")
            + (f", or a smaller max_rows_per_unit than {spec.max_rows_per_unit}" if spec.max_rows_per_unit > 1
               else "") + " (bins do not change this noise)",
            {"epsilon": f"too small for {method} here (one-way noise sd {sd:,.3g}, over {limit:,.3g})"})


def _plan_mst(spec: Spec) -> tuple[dict, dict, float | None]:
    """(event, details, the PLD certificate or None)."""
    from .encoding import fine_releases, one_way_releases

    cols, k = model_columns(spec), spec.max_rows_per_unit
    d, n1 = len(cols), sum(one_way_releases(c) for c in cols)
    m = sum(fine_releases(c, spec.refine_gaps) for c in cols)

    def event_of(rho):
        p = _mst_parts(rho, d, m, k, n1)
        return _mst_event(p["sigma1"] / k, p["eps_sel"], p["sigma2"] / k, p["sigma_f"] and p["sigma_f"] / k, d, m,
                          n1)

    lo = _largest_rho(event_of, spec, "MST")
    rho, certified = lo, None
    if spec.accountant == "pld":
        rho, certified = _pld_rho(spec, lo, d, m, n1)
    meas = _measured(rho, d, m, k, n1)
    (one, c1), (two, c2), (fine, cf) = meas["one"], meas["two"], meas["fine"]
    eps_sel = meas["select_epsilon"]
    event = _mst_event(1 / math.sqrt(2 * c1), eps_sel, 1 / math.sqrt(2 * c2), cf and 1 / math.sqrt(2 * cf), d, m,
                       n1)
    _refuse_too_little_signal("MST", spec, one.scale)
    details = {"one_way": one.to_dict(), "two_way": two.to_dict(), "fine": fine and fine.to_dict(),
               "select_scale": meas["select_scale"], "select_epsilon": eps_sel, "shares": SHARES,
               "one_way_releases": n1}
    return event, details, certified


AIM_SHARES = {"one_way": 0.6, "fine": 0.1, "rounds": 0.3}
AIM_ROUNDS_PER_COLUMN = 16  # the reference AIM's starting T = 16 d (the first rounds' rho is rounds_rho / T)
# The rounds' wall-clock allowance: then one last round spends what is left. Each round
# costs more as the model grows (40 binary columns: 2.6 s at first, 6-9 s by round 80, of
# up to 640), and a run past the worker's time limit fails after the read, charged, with
# nothing released.
AIM_ROUNDS_SECONDS = 1800


def _aim_event(z1: float, zf: float | None, rounds_rho: float, n1: int, m: int) -> dict:
    """The one-way and fine histograms (each a discrete Gaussian: ``gaussian``), then the
    adaptive rounds as the zCDP budget they may spend: rho-zCDP is exactly the RDP curve
    alpha * rho, stated as the one event every accountant prices by its RDP curve (and
    not by a single Gaussian's tighter exact tradeoff, which a mix of exponential and
    Gaussian mechanisms does not have): ``subsampled_gaussian`` at sample rate 1, one
    step, noise multiplier 1 / sqrt(2 rho)."""
    parts = [_gaussians(z1, n1)]
    if m:
        parts.append(_gaussians(zf, m))
    parts.append({"kind": "subsampled_gaussian", "sample_rate": 1.0,
                  "noise_multiplier": 1.0 / math.sqrt(2.0 * rounds_rho), "steps": 1})
    return {"kind": "composed", "events": parts}


def _plan_aim(spec: Spec) -> tuple[dict, dict]:
    """AIM (aim.py): the one-way measurements (as MST's, for the private compression) and
    the fine histograms are fixed in advance; the rounds are a zCDP budget ``rounds_rho``.
    The total rho is the largest the ledger's RDP accountant charges at most epsilon for."""
    from .encoding import fine_releases, one_way_releases

    cols, k = model_columns(spec), spec.max_rows_per_unit
    d, n1 = len(cols), sum(one_way_releases(c) for c in cols)
    m = sum(fine_releases(c, spec.refine_gaps) for c in cols)
    fine_share = AIM_SHARES["fine"] if m else 0.0
    rounds_share = 1.0 - AIM_SHARES["one_way"] - fine_share

    def sigmas(rho):
        s1 = k / math.sqrt(2 * AIM_SHARES["one_way"] * rho / n1)
        return s1, (k / math.sqrt(2 * fine_share * rho / m) if m else None)

    def event_of(rho):
        s1, sf = sigmas(rho)
        return _aim_event(s1 / k, sf and sf / k, rounds_share * rho, n1, m)

    rho = _largest_rho(event_of, spec, "AIM")

    def calibrated(rho):
        s1, sf = sigmas(rho)
        one, c1 = opendp_noise.calibrate("gaussian", k, (k / s1) ** 2 / 2, integer=True, vector=True)
        fine, cf = (opendp_noise.calibrate("gaussian", k, (k / sf) ** 2 / 2, integer=True, vector=True) if m
                    else (None, None))
        event = _aim_event(1 / math.sqrt(2 * c1), cf and 1 / math.sqrt(2 * cf), rounds_share * rho, n1, m)
        return one, fine, event

    one, fine, event = calibrated(rho)
    # The calibrated costs pass through sqrt and squares: the charge may land an ulp above
    # the target, which a plan must never do. Step rho down until it does not.
    while _rdp_epsilon(event, spec.delta) > spec.epsilon:
        rho *= 1 - 1e-9
        one, fine, event = calibrated(rho)
    rounds_rho = rounds_share * rho
    _refuse_too_little_signal("AIM", spec, one.scale)
    details = {"one_way": one.to_dict(), "fine": fine and fine.to_dict(), "rounds_rho": rounds_rho,
               "rounds": AIM_ROUNDS_PER_COLUMN * d, "rounds_seconds": AIM_ROUNDS_SECONDS, "sensitivity": k,
               "shares": AIM_SHARES,
               "one_way_releases": n1}
    return event, details


def select_cost(scale: float, k: int) -> float:
    """OpenDP's epsilon for one report-noisy-max round at score sensitivity k."""
    return float(opendp_noise.noisy_max(scale).map(float(k)))


def _plan_vae(spec: Spec) -> tuple[dict, dict]:
    """The VAE's DP-SGD run, calibrated as the DP-SGD engine's training is: the smallest
    noise multiplier whose event costs at most epsilon at the refined RDP order
    (``engines.dpsgd.calibrate.noise_multiplier``), reported by ``_refined_epsilon``."""
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


def _refined_epsilon(event: dict, delta: float) -> float:
    """The event's epsilon at the order refined off the grid (``accounting.rdp.compose``, the
    ledger's ``refined_epsilon`` of the charged event): what a DP-SGD run is calibrated to
    and reports (never above ``_rdp_epsilon``)."""
    from accounting import parse_event, rdp

    return rdp.compose([parse_event(event)], delta).epsilon


REFINE_MAX_CUT_SHARE = 0.02  # heavy gaps are measured again only where a value this common would show
REFINE_CELLS = 10_000  # the cells a second measurement is judged by (its heavy threshold's N)


def _refinement_pays(spec: Spec, method_details: dict) -> bool:
    """Whether the heavy gaps' second measurement (``encoding.refines_gaps``) can find a
    value held by ``REFINE_MAX_CUT_SHARE`` of the training units above its noise. It shares
    the fine budget with the value histograms: on a helper's 614-row table (MatchIt's
    lalonde, earnings in cents) it could find no value (its cut was 23% of the rows), while
    the value histograms' noise grew by sqrt(2) and their spike at 0 (23% of the rows) was
    lost in 3 runs of 9. From public figures only: the plan's noise and the units."""
    from .encoding import heavy_threshold

    fine = method_details.get("fine")
    return bool(fine) and heavy_threshold(REFINE_CELLS) * fine["scale"] <= REFINE_MAX_CUT_SHARE * spec.n_train_units


def make_plan(request: EngineRequest, ds: DatasetMeta) -> Plan:
    spec = validate(request.kind, request.params, ds)
    while True:
        try:
            if spec.method == "mst":
                event, method_details, certified = _plan_mst(spec)
            elif spec.method == "aim":
                (event, method_details), certified = _plan_aim(spec), None
            else:
                (event, method_details), certified = _plan_vae(spec), None
            if spec.refine_gaps and not _refinement_pays(spec, method_details):
                spec = replace(spec, refine_gaps=False)
                continue
            break
        except PlanError as e:
            # a default k whose one-way noise is refused: half of it (the noise scales with k)
            if not (spec.rows_per_unit_auto and spec.max_rows_per_unit > 1 and "epsilon" in e.errors):
                raise
            spec = with_rows_per_unit(spec, spec.max_rows_per_unit // 2)
    # MST: the grid's epsilon, which it is calibrated to; the VAE (DP-SGD): the refined order's
    planned = _refined_epsilon(event, spec.delta) if spec.method == "vae" else _rdp_epsilon(event, spec.delta)
    # planned_epsilon: the event by its RDP curve (MST, AIM: the gate filter's figure, what
    # the ledger charges; the VAE: at the refined order, a little under the ledger's grid
    # charge, as a DP-SGD train request); certified_epsilon: the run's own guarantee, by the accountant that
    # calibrated it (PLD is valid for this one pre-planned run, never as the gate's filter)
    details = {"version": DETAILS_VERSION, "spec": spec.to_dict(), spec.method: method_details,
               "planned_epsilon": planned, "certified_by": spec.accountant,
               "certified_epsilon": planned if certified is None else certified}
    return Plan(event=event, columns=spec.names, details=details)
