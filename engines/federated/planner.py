"""The plan of a federated run: validate, calibrate the noise, state the event. No data.

Central client-level DP: ``rounds`` rounds of the Poisson-subsampled Gaussian mechanism
over *sites* (q = sites_per_round / registered sites, noise multiplier z on the sum of
updates clipped to C), plus one held-out evaluation per round released by OpenDP's
Laplace mechanism (each row moves the correct-prediction sum and the row count by at most
1: L1 sensitivity 2), after every ``eval_every``-th round and the last (E evaluations),
each at eval_epsilon / E:

    composed[ subsampled_gaussian(q, z, rounds), self_composed(laplace(e), E) ]

``engines.dpsgd.calibrate`` (the same refined RDP accountant as DP-SGD) finds z for a
target epsilon and gives the epsilon after every round.

Local sample-level DP (``mode: "local"``): each site runs DP-SGD on its own rows (Poisson
sampling at q_s = local_batch_size / its registered training rows, each row's gradient
clipped to C, Gaussian noise z_s C on the sum, divided by the expected batch), round(1 /
q_s) steps per local epoch; the server averages the sites' updates without more noise.
Each site's z_s is calibrated so that its own run (with the evaluations) meets the target.
The sites hold disjoint rows, so by parallel composition the dataset's cost is the
largest of the sites' costs: the plan states the event of that site's run. A site-level guarantee implies the
same guarantee for each row (every row lives at one site), so the training event and the
row-level evaluations compose in the dataset's ledger as row-level events.
"""

from __future__ import annotations

import math

from engines.aggregates import noise as opendp_noise
from engines.aggregates.noise import Noise
from engines.dpsgd import calibrate
from engines.dpsgd.intervals import ALPHA_EACH, expected_halfwidth
from engines.types import DatasetMeta, EngineRequest, Plan, PlanError

from .params import validate

DETAILS_VERSION = 1
EVAL_SENSITIVITY = 2.0


def eval_rounds(rounds: int, every: int) -> list[int]:
    """The rounds after which the global model is evaluated: every k-th and the last."""
    return [r for r in range(1, rounds + 1) if r % every == 0 or r == rounds]


def eval_noise(eval_epsilon: float, evals: int) -> tuple[dict | None, float]:
    if eval_epsilon <= 0 or evals == 0:
        return None, 0.0
    noise, cost = opendp_noise.calibrate("laplace", EVAL_SENSITIVITY, eval_epsilon / evals, integer=False,
                                         vector=True)
    return noise.to_dict(), cost


def local_sites(spec, ds: DatasetMeta) -> dict:
    """Local mode: each site's Poisson rate over its training rows (from its registered,
    public row count), its DP-SGD steps per round, its expected batch."""
    out = {}
    for s in getattr(ds, "sites", None) or ():
        n_train = max(1, int(s["n_rows"]) - int(round(int(s["n_rows"]) * spec.test_fraction)))
        q = min(1.0, spec.local_batch_size / n_train)
        out[s["site"]] = {"n_train": n_train, "q": q, "steps_per_round": spec.local_epochs * max(1, round(1 / q))}
    return out


def _local_calibrate(spec, sites: dict, each: float, evals: int) -> None:
    """Every site's noise multiplier for the target (or the given one): each site's run of
    DP-SGD steps, with the evaluations, costs at most the target."""
    for site in sites.values():
        steps = spec.rounds * site["steps_per_round"]
        z = spec.noise_multiplier
        if spec.target_epsilon is not None:
            try:
                z = calibrate.noise_multiplier(spec.target_epsilon, spec.delta, site["q"], steps, each, evals)
            except calibrate.CalibrationError as e:
                raise PlanError(str(e), {"target_epsilon": str(e)}) from None
        site["z"] = z


def make_plan(request: EngineRequest, ds: DatasetMeta) -> Plan:
    spec = validate(request.kind, request.params, ds)
    try:
        return _plan(spec, ds)
    except (ArithmeticError, ValueError, opendp_noise.OpenDPError) as e:  # a noise scale of inf, a share of 0
        raise calibrate.uncalibrable(e, request.params) from None


def _plan(spec, ds: DatasetMeta) -> Plan:
    q, rounds = spec.sample_rate, spec.rounds
    if not spec.private:
        z, noise, each, evals, event, planned, local = None, None, 0.0, 0, {"kind": "non_private"}, None, None
    else:
        n_evals = len(eval_rounds(rounds, spec.eval_every))
        noise, each = eval_noise(spec.eval_epsilon, n_evals)
        evals = n_evals if noise else 0
        z = spec.noise_multiplier
        local = None
        if spec.mode == "local":
            local = local_sites(spec, ds)
            _local_calibrate(spec, local, each, evals)
        elif spec.target_epsilon is not None:
            try:
                z = calibrate.noise_multiplier(spec.target_epsilon, spec.delta, q, rounds, each, evals)
            except calibrate.CalibrationError as e:
                raise PlanError(str(e).replace("steps", "rounds"), {"target_epsilon": str(e)}) from None
        partial = {"spec": spec.to_dict(), "noise_multiplier": z, "eval_epsilon_each": each, "local": local}
        event = rounds_event(partial, rounds, evals)
        planned = epsilon_after(partial, rounds, evals)
        if spec.max_epsilon is not None:
            first = epsilon_after(partial, 1, int(evals > 0))
            if first > spec.max_epsilon:
                raise PlanError(f"max_epsilon {spec.max_epsilon:g} is below the cost of one round ({first:.4g})",
                                {"max_epsilon": f"below the cost of one round ({first:.4g})"})
    n_rows = sum(int(s.get("n_rows", 0)) for s in (getattr(ds, "sites", None) or ()))
    halfwidth = (expected_halfwidth(Noise.from_dict(noise).halfwidth(ALPHA_EACH), int(n_rows * spec.test_fraction))
                 if noise else None)
    details = {"version": DETAILS_VERSION, "spec": spec.to_dict(), "dataset": ds.name, "noise_multiplier": z,
               "local": local if spec.private else None,
               "eval_noise": noise, "eval_epsilon_each": each, "evals": evals, "planned_epsilon": planned,
               "eval_ci95_halfwidth": halfwidth,
               "site_eval_rows": {str(s["site"]): held_out_bound(int(s.get("n_rows", 0)), spec.test_fraction)
                                  for s in (getattr(ds, "sites", None) or ())},
               "n_parameters": (sum(1 if f["type"] == "numeric" else len(f["domain"]) for f in spec.features) + 1)
               * spec.classes}
    columns = [f["column"] for f in spec.features] + [spec.target["column"]]
    return Plan(event=event, columns=columns, details=details)


def held_out_bound(n_rows: int, test_fraction: float) -> int:
    """The most held-out rows a site registered with ``n_rows`` counts in an evaluation:
    each row is held out with probability ``test_fraction``, so 4 standard deviations over
    the mean (an honest site passes it with probability 1 - 3e-5). A site claiming more
    (10**15 rows, which would drag the released accuracy to 0) counts this many."""
    mean = n_rows * test_fraction
    return math.ceil(mean + 4 * math.sqrt(mean * (1 - test_fraction)) + 1)


def _worst_site(details: dict, rounds: int, evals: int) -> tuple[dict | None, float]:
    """Local mode: the site whose run costs the most after ``rounds`` (parallel composition
    over disjoint sites: each row is at one site, so the dataset's cost is the largest)."""
    spec, worst, eps = details["spec"], None, -1.0
    for site in details["local"].values():
        e = calibrate.epsilon(site["q"], site["z"], rounds * site["steps_per_round"], details["eval_epsilon_each"],
                              evals, spec["delta"])
        if e > eps:
            worst, eps = site, e
    return worst, eps


def rounds_event(details: dict, rounds: int, evals: int) -> dict:
    """The event of the rounds and evaluations actually done (a cancel, a cap, a failure).

    Central mode: ``rounds`` subsampled-Gaussian steps over sites. Local mode: the DP-SGD
    run of the site that costs the most (its steps in those rounds), parallel composition
    over the disjoint sites; the evaluations, over all sites' rows, compose with it."""
    spec = details["spec"]
    if not spec["private"]:
        return {"kind": "non_private"}
    if details.get("local"):
        site, _ = _worst_site(details, rounds, evals)
        return calibrate.run_event(site["q"], site["z"], rounds * site["steps_per_round"],
                                   details["eval_epsilon_each"], evals)
    return calibrate.run_event(spec["sample_rate"], details["noise_multiplier"], rounds,
                               details["eval_epsilon_each"], evals)


def epsilon_after(details: dict, rounds: int, evals: int) -> float | None:
    spec = details["spec"]
    if not spec["private"]:
        return None
    if details.get("local"):
        return _worst_site(details, rounds, evals)[1]
    return calibrate.epsilon(spec["sample_rate"], details["noise_multiplier"], rounds, details["eval_epsilon_each"],
                             evals, spec["delta"])
