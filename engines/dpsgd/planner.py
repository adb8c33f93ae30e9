"""Planning a training request: validate, fix the sampling, calibrate the noise, state the
event the whole run will cost. No torch, no data.

A ``train`` request is one run; a ``sweep`` is one run per epsilon (``"inf"``: a
non-private baseline, event ``non_private``), charged as the composition of its runs.
Held-out evaluations (one per epoch) take ``eval_epsilon`` of each run's budget, each
released through OpenDP's Laplace mechanism (L1 sensitivity 3: a unit moves the metric
sum, the loss sum and the unit count by at most 1 each), the metric with its 95% interval
(``intervals``). The final evaluation, of the model the run releases (after its last
epoch, or when it stops early), is the result's metric and gets ``FINAL_SHARE`` of
``eval_epsilon`` (all of it in a one-epoch run); the per-epoch ones, which show progress
and decide early stopping, share the rest evenly. Each run states the final interval's
expected half-width (``eval_ci95_halfwidth``) so the share can be chosen before spending.
Without an ``eval_epsilon`` the plan chooses it (``eval_share``): the least that states a
half-width of ``EVAL_HALFWIDTH`` over the declared held-out units, kept within 5% and 25%
of the run's target. (Split evenly over 20 epochs, the 25% gave each evaluation 1.25% of
the target: on 975 held-out units the released interval was [0, 1].) The evaluations'
Laplace releases compose under RDP at a small fraction of their nominal epsilon: at
target 1 on 22,524 training and 5,631 held-out units (AER/CPS1988, 3 epochs, batch 256,
evaluations split evenly), a share of 0.2 instead of 0.05 raised the noise multiplier
from 1.202 to 1.245 and narrowed the stated half-width from 0.20 to 0.05.
"""

from __future__ import annotations

import math

from engines.aggregates import noise as opendp_noise
from engines.aggregates.noise import Noise
from engines.types import DatasetMeta, EngineRequest, Plan, PlanError

from . import calibrate, pld
from .intervals import ALPHA_EACH, expected_halfwidth
from .model_spec import describe, n_parameters
from .params import DEFAULT_EVAL_SHARE, MAX_EVAL_SHARE, Spec, run_label, validate

DETAILS_VERSION = 1
EVAL_SENSITIVITY = 3.0
EVAL_HALFWIDTH = 0.05  # the 95% half-width the default evaluation share aims at
USELESS_HALFWIDTH = 0.4  # (80% of the range) when the most the default gives states this or more, the least is spent
FINAL_SHARE = 0.5  # of the evaluations' epsilon, the final evaluation's (the result's metric)


def eval_share(target: float, epochs: int, n_test_units: int) -> float:
    """The evaluations' epsilon when the request gives none: the least whose final
    evaluation's stated 95% half-width (``expected_halfwidth``: a metric near 0.5 over the
    declared held-out units) is ``EVAL_HALFWIDTH``, kept within [``DEFAULT_EVAL_SHARE``,
    ``MAX_EVAL_SHARE``] of ``target``; ``DEFAULT_EVAL_SHARE`` when even ``MAX_EVAL_SHARE``
    states ``USELESS_HALFWIDTH`` or more. Public numbers only."""
    lo, hi = 0.0, float(max(n_test_units, 1))  # the noise bound t: the half-width grows with it
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_halfwidth(mid, n_test_units) <= EVAL_HALFWIDTH:
            lo = mid
        else:
            hi = mid
    # Laplace of scale b = sensitivity / epsilon: t = b ln(1 / ALPHA_EACH) (``Noise.halfwidth``)
    needed = EVAL_SENSITIVITY * math.log(1 / ALPHA_EACH) / lo if lo > 0 else math.inf
    if epochs > 1:
        needed /= FINAL_SHARE
    most = MAX_EVAL_SHARE * target
    if needed > most and halfwidth_at(most, epochs, n_test_units) >= USELESS_HALFWIDTH:
        # even the most the default gives states an interval of 80% of the range or more:
        # the least is spent instead, and the rest trains the model (a probe's 62 held-out
        # units: 25% of epsilon 1 bought [0, 1] in 3 runs of 3)
        return DEFAULT_EVAL_SHARE * target
    return min(max(needed, DEFAULT_EVAL_SHARE * target), most)


def halfwidth_at(share: float, epochs: int, n_test_units: int) -> float:
    """The final evaluation's stated 95% half-width when the evaluations get ``share``."""
    final = share * (FINAL_SHARE if epochs > 1 else 1.0)
    return expected_halfwidth(EVAL_SENSITIVITY * math.log(1 / ALPHA_EACH) / final, n_test_units)


def _laplace(epsilon: float):
    """(Noise dict or None, OpenDP's epsilon of one evaluation at ``epsilon``)."""
    if epsilon <= 0:
        return None, 0.0
    noise, cost = opendp_noise.calibrate("laplace", EVAL_SENSITIVITY, epsilon, integer=False, vector=True)
    return noise.to_dict(), cost


def eval_noises(eval_epsilon: float, epochs: int) -> dict:
    """The evaluations of a run of ``epochs`` at ``eval_epsilon`` in all: ``evals`` per-epoch
    ones (after every epoch but the last) at ``eval_epsilon_each`` with ``eval_noise``, and
    the final one at ``final_eval_epsilon`` with ``final_eval_noise`` (None, 0.0: none)."""
    if eval_epsilon <= 0:
        return {"eval_noise": None, "eval_epsilon_each": 0.0, "evals": 0, "final_eval_noise": None,
                "final_eval_epsilon": 0.0}
    share = FINAL_SHARE if epochs > 1 else 1.0
    final, final_cost = _laplace(share * eval_epsilon)
    noise, each = _laplace((1 - share) * eval_epsilon / (epochs - 1)) if epochs > 1 else (None, 0.0)
    return {"eval_noise": noise, "eval_epsilon_each": each, "evals": epochs - 1 if noise else 0,
            "final_eval_noise": final, "final_eval_epsilon": final_cost}


def _run(spec: Spec, q: float, steps: int, *, label: str, target: float | None, z: float | None,
         eval_epsilon: float, field: str) -> dict:
    ev = eval_noises(eval_epsilon, spec.epochs)
    each, evals, final = ev["eval_epsilon_each"], ev["evals"], ev["final_eval_epsilon"]
    calibrator = pld.noise_multiplier if spec.accountant == pld.NAME else calibrate.noise_multiplier
    if target is not None:
        try:
            z = calibrator(target, spec.delta, q, steps, each, evals, final)
        except calibrate.CalibrationError as e:
            raise PlanError(str(e), {field: str(e)}) from None
    planned = calibrate.epsilon(q, z, steps, each, evals, spec.delta, final)
    # what the final evaluation's 95% interval will be (a metric near 0.5 over the declared
    # held-out units), stated before any data is read
    halfwidth = (expected_halfwidth(Noise.from_dict(ev["final_eval_noise"]).halfwidth(ALPHA_EACH),
                                    spec.n_test_units) if ev["final_eval_noise"] else None)
    # planned_epsilon: what the ledger charges (the run's event by its RDP curve, composed by
    # the gate's filter); certified_epsilon: the run's own guarantee, by the accountant that
    # calibrated it (PLD is valid for this one pre-planned run, never as the gate's filter)
    certified = (pld.epsilon(q, z, steps, each, evals, spec.delta, final=final) if spec.accountant == pld.NAME
                 else planned)
    return {"label": label, "target_epsilon": target, "noise_multiplier": z, **ev,
            "eval_ci95_halfwidth": halfwidth, "planned_epsilon": planned,
            "certified_by": spec.accountant, "certified_epsilon": certified,
            "event": calibrate.run_event(q, z, steps, each, evals, final)}


def make_plan(request: EngineRequest, ds: DatasetMeta) -> Plan:
    spec = validate(request.kind, request.params, ds)
    try:
        return _plan(spec)
    except (ArithmeticError, ValueError, opendp_noise.OpenDPError) as e:  # a noise scale of inf, a share of 0
        raise calibrate.uncalibrable(e, request.params) from None


def _plan(spec: Spec) -> Plan:
    q, per_epoch = calibrate.sampling(spec.n_train_units, spec.batch_size, spec.epochs)
    steps = per_epoch * spec.epochs
    runs = []
    if spec.kind == "train":
        share = (spec.eval_epsilon if spec.eval_epsilon >= 0
                 else eval_share(spec.target_epsilon, spec.epochs, spec.n_test_units))
        runs.append(_run(spec, q, steps, label="", target=spec.target_epsilon, z=spec.noise_multiplier,
                         eval_epsilon=share, field="target_epsilon"))
        run = runs[0]
        if spec.max_epsilon is not None:
            first = pld.certifier(spec.accountant)(q, run["noise_multiplier"], per_epoch, run["eval_epsilon_each"],
                                                   int(run["evals"] > 0), spec.delta,
                                                   final=run["final_eval_epsilon"])
            if first > spec.max_epsilon:
                raise PlanError(f"max_epsilon {spec.max_epsilon:g} is below the cost of one epoch ({first:.4g})",
                                {"max_epsilon": f"below the cost of one epoch ({first:.4g})"})
        event = run["event"]
    else:
        for eps in spec.epsilons:
            if eps == "inf":
                runs.append({"label": "inf", "target_epsilon": None, "noise_multiplier": None,
                             **eval_noises(0.0, spec.epochs), "planned_epsilon": None,
                             "event": {"kind": "non_private"}})
            else:
                share = spec.eval_epsilon if spec.eval_epsilon >= 0 else eval_share(eps, spec.epochs,
                                                                                    spec.n_test_units)
                runs.append(_run(spec, q, steps, label=run_label(eps), target=eps, z=None, eval_epsilon=share,
                                 field="epsilons"))
        event = {"kind": "composed", "events": [r["event"] for r in runs]}
    columns = [f["column"] for f in spec.features] + [spec.target["column"]]
    details = {"version": DETAILS_VERSION, "spec": spec.to_dict(), "sample_rate": q, "steps_per_epoch": per_epoch,
               "steps": steps, "runs": runs, "model": describe(spec.layers), "n_parameters": n_parameters(spec.layers),
               "model_fixes": spec.model_fixes}
    return Plan(event=event, columns=columns, details=details)
