"""The plan of a federated run: validate, calibrate the noise, state the event. No data.

Central client-level DP: ``rounds`` rounds of the Poisson-subsampled Gaussian mechanism
over *sites* (q = sites_per_round / registered sites, noise multiplier z on the sum of
updates clipped to C), plus one held-out evaluation per round released by OpenDP's
Laplace mechanism (each row moves the correct-prediction sum and the row count by at most
1: L1 sensitivity 2), after every ``eval_every``-th round and the last (E evaluations),
each at eval_epsilon / E:

    composed[ subsampled_gaussian(q, z, rounds), self_composed(laplace(e), E) ]

``engines.dpsgd.calibrate`` (the same refined RDP accountant as DP-SGD) finds z for a
target epsilon and gives the epsilon after every round. A site-level guarantee implies the
same guarantee for each row (every row lives at one site), so the training event and the
row-level evaluations compose in the dataset's ledger as row-level events.
"""

from __future__ import annotations

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


def make_plan(request: EngineRequest, ds: DatasetMeta) -> Plan:
    spec = validate(request.kind, request.params, ds)
    q, rounds = spec.sample_rate, spec.rounds
    if not spec.private:
        z, noise, each, evals, event, planned = None, None, 0.0, 0, {"kind": "non_private"}, None
    else:
        n_evals = len(eval_rounds(rounds, spec.eval_every))
        noise, each = eval_noise(spec.eval_epsilon, n_evals)
        evals = n_evals if noise else 0
        z = spec.noise_multiplier
        if spec.target_epsilon is not None:
            try:
                z = calibrate.noise_multiplier(spec.target_epsilon, spec.delta, q, rounds, each, evals)
            except calibrate.CalibrationError as e:
                raise PlanError(str(e).replace("steps", "rounds"), {"target_epsilon": str(e)}) from None
        event = calibrate.run_event(q, z, rounds, each, evals)
        planned = calibrate.epsilon(q, z, rounds, each, evals, spec.delta)
        if spec.max_epsilon is not None:
            first = calibrate.epsilon(q, z, 1, each, int(evals > 0), spec.delta)
            if first > spec.max_epsilon:
                raise PlanError(f"max_epsilon {spec.max_epsilon:g} is below the cost of one round ({first:.4g})",
                                {"max_epsilon": f"below the cost of one round ({first:.4g})"})
    n_rows = sum(int(s.get("n_rows", 0)) for s in (getattr(ds, "sites", None) or ()))
    halfwidth = (expected_halfwidth(Noise.from_dict(noise).halfwidth(ALPHA_EACH), int(n_rows * spec.test_fraction))
                 if noise else None)
    details = {"version": DETAILS_VERSION, "spec": spec.to_dict(), "dataset": ds.name, "noise_multiplier": z,
               "eval_noise": noise, "eval_epsilon_each": each, "evals": evals, "planned_epsilon": planned,
               "eval_ci95_halfwidth": halfwidth,
               "n_parameters": (sum(1 if f["type"] == "numeric" else len(f["domain"]) for f in spec.features) + 1)
               * spec.classes}
    columns = [f["column"] for f in spec.features] + [spec.target["column"]]
    return Plan(event=event, columns=columns, details=details)


def rounds_event(details: dict, rounds: int, evals: int) -> dict:
    """The event of the rounds and evaluations actually done (a cancel, a cap, a failure)."""
    spec = details["spec"]
    if not spec["private"]:
        return {"kind": "non_private"}
    return calibrate.run_event(spec["sample_rate"], details["noise_multiplier"], rounds,
                               details["eval_epsilon_each"], evals)


def epsilon_after(details: dict, rounds: int, evals: int) -> float | None:
    spec = details["spec"]
    if not spec["private"]:
        return None
    return calibrate.epsilon(spec["sample_rate"], details["noise_multiplier"], rounds, details["eval_epsilon_each"],
                             evals, spec["delta"])
