"""AIM (McKenna, Mullins, Sheldon & Miklau 2022, "AIM: An Adaptive and Iterative Mechanism
for Differentially Private Synthetic Data") on the cells MST uses, with ``mbi``.

1. Every column's one-way marginal is measured and compressed exactly as in MST
   (``mst.OneWay``: a tree of noisy histograms for a wide numeric column, rare cells
   merged privately); the model's domain is the compressed cells (post-processing).
2. The workload is every pair of columns (weight 1 each); the candidates are its
   downward closure, every pair and every column, each weighted by how much of the
   workload it covers (``workload``: a column d - 1, a pair 2 (d - 1)).
3. Rounds, each with the zCDP share ``rho_t``: select the candidate the current model
   answers worst, by the exponential mechanism (OpenDP's report-noisy-max with Gumbel
   noise under zCDP: rho = eps^2 / 8) on ``w * (L1 error - sqrt(2 / pi) sigma cells)``,
   among the candidates whose junction tree stays below a size that grows with the
   budget spent (the size penalty); measure it with OpenDP's discrete Gaussian (the rest
   of ``rho_t``); refit warm-started (every ``BATCH`` rounds, see ``_rounds``; longer when
   a marginal just measured is not yet fitted, ``_refit``). The
   scores' sensitivity is k times the largest weight (a unit moves a marginal by at most
   k rows in L1), k = ``max_rows_per_unit``. Annealing: when the refit moved the selected
   marginal by less than the noise could explain, the next round gets 4 times the zCDP
   (sigma / 2, epsilon x 2). When less than two rounds' share is left, one last round
   spends exactly what is left.
4. A final fit, ``synthetic_data``, and back to measured cells (``mst.to_cells``).

The selections and measurements of step 3 are chosen as the run goes (their number and
scales depend on the data): they form a zCDP filter whose total is the plan's
``rounds_rho``, and the run stops before it would exceed it (``spent`` is what OpenDP's
privacy maps certify, at most ``rounds_rho``). planner.py states that part of the event.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np

from engines.aggregates import noise as opendp_noise
from engines.aggregates.noise import Noise

from . import encoding, mst

SELECT_SHARE = 0.1  # of each round's zCDP, as in the reference AIM
BATCH = 3  # rounds between refits (see _rounds)
ROUND_ITERS = 100  # mirror-descent steps after each measurement (warm-started)
REFIT_ITERS = 1000  # when those steps leave a marginal just measured unfitted (``_refit``)
FINAL_ITERS = 1000
MAX_CELLS = 2 ** 20  # the junction tree's size cap once the whole budget is spent (reference: 80 MB)


def workload(cols: list[str]) -> dict[tuple, float]:
    """The candidates (the downward closure of all pairs) with their weights: how many
    workload attributes they share, summed over the workload (as the reference AIM)."""
    pairs = list(itertools.combinations(cols, 2))
    cands = {(c,): 0.0 for c in cols}
    cands.update({p: 0.0 for p in pairs})
    for cl in cands:
        cands[cl] = float(sum(len(set(cl) & set(w)) for w in pairs))
    return cands


def select_noise(rho: float, sensitivity: float) -> tuple[float, float]:
    """(scale, rho) of OpenDP's report-noisy-max with Gumbel noise whose zCDP map at score
    sensitivity ``sensitivity`` is at most ``rho`` (the exponential mechanism at
    epsilon = sqrt(8 rho), by its bounded-range zCDP bound)."""

    def cost(s):
        return float(opendp_noise.noisy_max(s, zcdp=True).map(float(sensitivity)))

    return opendp_noise._fit(cost, sensitivity / math.sqrt(2.0 * rho), rho)


def _pair_marginal(model, a: str, b: str) -> np.ndarray:
    """The model's marginal of (a, b) from its potentials, by variable elimination in numpy
    (what mbi's ``variable_elimination`` does, without compiling a program per pair): the
    other columns summed out one at a time, cheapest product first. One einsum over every
    clique spent its time in numpy's search for an order (4-36 ms per pair on a model of
    ggplot2's diamonds, 0.6-1.3 ms this way)."""
    pot = model.potentials
    size = {c: int(pot.domain[c]) for c in pot.domain.attributes}
    factors = []
    for cl in pot.cliques:
        t = np.asarray(pot.tables[cl].values, dtype=np.float64)
        factors.append((tuple(cl), np.exp(t - t.max())))
    rest = {c for cl, _ in factors for c in cl} - {a, b}
    while rest:
        def joined(z):
            return tuple(dict.fromkeys(c for cl, _ in factors if z in cl for c in cl))
        z = min(sorted(rest), key=lambda z: math.prod(size[c] for c in joined(z)))
        out = tuple(c for c in joined(z) if c != z)
        t = _contract([f for f in factors if z in f[0]], out)
        factors = [f for f in factors if z not in f[0]] + [(out, t / max(t.max(), 1e-300))]
        rest.discard(z)
    m = _contract(factors + [((a,), np.ones(size[a])), ((b,), np.ones(size[b]))], (a, b))
    return m.ravel() / max(m.sum(), 1e-300) * float(model.total)


# numpy's einsum takes at most 64 operands (32 before numpy 2): a 66-column table's AIM
# left a scalar factor for each column no pair joined and failed in its last contraction,
# after the data was read (a probe: the request charged, nothing released)
MAX_OPERANDS = 24


def _contract(factors: list[tuple[tuple, np.ndarray]], out: tuple) -> np.ndarray:
    """The product of ``factors`` (columns, table) summed down to the columns ``out``, up to
    a constant (the callers normalise it): more than MAX_OPERANDS factors are multiplied a
    batch at a time, each batch kept on all of its columns."""
    while len(factors) > MAX_OPERANDS:
        head, factors = factors[:MAX_OPERANDS], factors[MAX_OPERANDS:]
        cols = tuple(dict.fromkeys(c for cl, _ in head for c in cl))
        t = _einsum(head, cols)
        factors = [(cols, t / max(float(t.max()), 1e-300))] + factors
    return _einsum(factors, out)


def _einsum(factors: list[tuple[tuple, np.ndarray]], out: tuple) -> np.ndarray:
    index = {c: i for i, c in enumerate(dict.fromkeys(c for cl, _ in factors for c in cl))}
    args = [x for cl, t in factors for x in (t, [index[c] for c in cl])]
    return np.einsum(*args, [index[c] for c in out], optimize=len(factors) > 2)


def _model_answer(model, cl: tuple) -> np.ndarray:
    if len(cl) == 1 or model.marginals.supports(cl):
        return np.asarray(model.project(cl).datavector(), dtype=np.float64)
    return _pair_marginal(model, *cl)


def _size_ok(domain, model, cl: tuple, limit: float, sizes: dict) -> bool:
    """Whether the model with ``cl`` added stays within ``limit`` (bytes); ``sizes`` keeps
    each candidate's junction-tree size for this ``model`` (the model changes only at a
    refit, every ``BATCH`` rounds, while the limit grows each round: mbi's
    ``hypothetical_model_size`` for every candidate in every round took 464 of a 60-column
    table's 600 s; 185 of 350 s with the sizes kept, ``bench/bench_aim_wide.py``)."""
    from mbi.junction_tree import hypothetical_model_size

    if any(set(cl) <= set(m) for m in model.cliques):
        return True
    if cl not in sizes:
        sizes[cl] = hypothetical_model_size(domain, list(model.cliques) + [cl]) * 2 ** 20 / 8
    return sizes[cl] <= limit


def synthesize(codes: dict[str, np.ndarray], columns: list[dict], details: dict, rows: int, progress,
               heavy: dict | None = None,
               reweight: tuple[str, np.ndarray] | None = None) -> tuple[dict[str, np.ndarray], dict, dict]:
    """As ``mst.synthesize``: cells of ``rows`` synthetic rows, what was released, and each
    measured cell's weight (for decoding)."""
    sizes = {c["column"]: encoding.cell_size(c) for c in columns}
    return synthesize_from_counts(mst.marginal_counts(codes, sizes), columns, details, rows, progress, heavy,
                                  reweight)


def synthesize_from_counts(counts: dict, columns: list[dict], details: dict, rows: int, progress,
                           heavy: dict | None = None,
                           reweight: tuple[str, np.ndarray] | None = None) -> tuple[dict[str, np.ndarray], dict, dict]:
    mbi, MirrorDescent = mst._mbi()
    progress({"phase": "measuring one-way marginals", "fraction": 0.05, "marginals_measured": 0})
    ow = mst.OneWay(counts, columns, Noise.from_dict(details["one_way"]), mbi)
    domain = ow.domain(mbi)
    measurements = list(ow.measurements)
    estimator = MirrorDescent()
    model = estimator.estimate(domain, measurements, known_total=ow.total, iters=ROUND_ITERS)
    model, rounds, spent = _rounds(model, estimator, domain, measurements, ow, counts, details, progress, mbi)

    progress({"phase": "fitting the graphical model", "fraction": 0.8, "marginals_measured": len(measurements)})
    model = estimator.estimate(domain, measurements, known_total=ow.total, iters=FINAL_ITERS, warm_start=model)
    progress({"phase": "sampling", "fraction": 0.85, "marginals_measured": len(measurements)})
    out, noisy = mst.sample(model, rows, ow, heavy, reweight)
    info = {"selected_marginals": [r["marginal"] for r in rounds], "rounds": len(rounds),
            "rounds_rho_spent": spent, "model_cells": dict(ow.csize)}
    return out, info, noisy


class Budget:
    """The rounds' zCDP filter: ``rounds_rho`` in all, the first round's share
    ``rounds_rho / max_rounds``, x4 after a round that asks to anneal; when less than two
    rounds' share is left (or the round is the ``max_rounds``-th) the round is the last
    and gets what is left. ``spend`` adds what OpenDP's maps certify a round cost (at most
    its share); ``spent`` never exceeds ``rounds_rho``."""

    def __init__(self, rounds_rho: float, max_rounds: int, seconds: float | None = None):
        self.total, self.max_rounds = float(rounds_rho), int(max_rounds)
        self.share, self.spent, self.rounds, self.final = self.total / self.max_rounds, 0.0, 0, False
        self.deadline = None if seconds is None else time.monotonic() + seconds

    def next(self) -> float:
        """The next round's share (0: nothing left; stop). Past the deadline, the round is
        the last (the whole budget still spent: the charge is the plan's)."""
        left = self.total - self.spent
        self.final = (left < 2 * self.share or self.rounds + 1 >= self.max_rounds
                      or (self.deadline is not None and time.monotonic() >= self.deadline))
        if self.final:
            self.share = left * (1 - 1e-9)  # a hair under what is left: OpenDP's costs summed in floats
        return self.share if self.share > 0 else 0.0

    def spend(self, cost: float, anneal: bool) -> None:
        if not cost <= self.share * (1 + 1e-12):  # the selection's and measurement's maps, summed
            raise ValueError(f"a round cost {cost!r}, more than its share {self.share!r}")
        self.spent += cost
        self.rounds += 1
        if anneal:
            self.share *= 4.0  # sigma / 2, epsilon x 2


def _merge(measurements: list, index: dict, new) -> None:
    """``new`` folded into this run's earlier measurement of the same marginal
    (``index``: marginal -> its position; inverse-variance weighted: the same likelihood
    as both terms, up to a constant), so that mbi's loss keeps its structure and is not
    compiled again; else appended."""
    i = index.get(new.clique)
    if i is None:
        index[new.clique] = len(measurements)
        measurements.append(new)
        return
    old = measurements[i]
    w1, w2 = old.stddev ** -2, new.stddev ** -2
    y = (np.asarray(old.noisy_measurement) * w1 + np.asarray(new.noisy_measurement) * w2) / (w1 + w2)
    measurements[i] = type(new)(y, new.clique, stddev=float((w1 + w2) ** -0.5))


def _refit(estimator, domain, measurements, total, model, just_measured):
    """Mirror descent warm-started from ``model``: ``ROUND_ITERS`` steps, and if the model
    then answers a marginal of ``just_measured`` further from its measurement than twice
    what the noise explains (L1 over 2 ``noise_l1(sd)`` per cell; a model that fits is
    about 1 off), ``REFIT_ITERS`` more in one call (ten calls of 100 steps fit far less than
    one of 1,000: each starts its step size afresh; a sharp 60 x 60 pair stayed 6.6 times
    the noise off after ten, 0.96 after one). A model left far from a sharp marginal scored
    it worst again: on ggplot2's diamonds all 13 rounds re-measured three nearly functional
    pairs (carat, x, price) and no other column was modelled with anything (a helper's
    probe). The steps depend only on the noisy measurements: post-processing."""
    model = estimator.estimate(domain, measurements, known_total=total, iters=ROUND_ITERS, warm_start=model)
    if any(_off(model, m) > 2 for m in just_measured):
        model = estimator.estimate(domain, measurements, known_total=total, iters=REFIT_ITERS, warm_start=model)
    return model


def _off(model, m) -> float:
    """How far the model's answer to measurement ``m``'s marginal is from it, in units of
    the L1 distance its noise alone would give."""
    y = np.asarray(m.noisy_measurement)
    return float(np.abs(_model_answer(model, m.clique) - y).sum()) / (mst.noise_l1(m.stddev) * y.size)


def _rounds(model, estimator, domain, measurements, ow, counts, details, progress, mbi):
    """AIM's rounds (step 3 of the module docstring); appends to ``measurements``.
    Returns (the model, each round's marginal / sigma / rho, the zCDP spent).

    The model is refitted after every ``BATCH`` rounds (mbi compiles a program per new
    set of cliques, about 20 times the cost of the steps): in between, a marginal measured
    in this batch is answered by its own measurement (clipped at 0), every other by the
    last fit, and annealing compares the measurement with the last fit's answer."""
    cands = workload(ow.cols)
    answers = {cl: ow.single(counts, cl[0]) if len(cl) == 1 else ow.pair(counts, *cl) for cl in cands}
    sensitivity = details["sensitivity"] * max(cands.values())
    budget = Budget(details["rounds_rho"], details["rounds"], details.get("rounds_seconds"))
    est, fresh, index, rounds, sizes = {}, {}, {}, [], {}
    while not budget.final:
        rho_t = budget.next()
        if not rho_t > 0:
            break
        scale, sel_cost = select_noise(SELECT_SHARE * rho_t, sensitivity)
        meas, meas_cost = opendp_noise.calibrate("gaussian", details["sensitivity"], rho_t - sel_cost,
                                                 integer=True, vector=True)
        limit = MAX_CELLS * (budget.spent + rho_t) / budget.total  # the size penalty
        small = [cl for cl in cands if _size_ok(domain, model, cl, limit, sizes)]
        bias = mst.noise_l1(meas.scale)
        for cl in small:
            if cl in fresh:
                est[cl] = fresh[cl]
            elif cl not in est:
                est[cl] = _model_answer(model, cl)
        scores = [cands[cl] * (float(np.abs(answers[cl] - est[cl]).sum()) - bias * answers[cl].size) for cl in small]
        cl = small[int(opendp_noise.noisy_max(scale, zcdp=True)([float(s) for s in scores]))]
        y = np.asarray(meas.release(np.rint(answers[cl]).astype(np.int64)), dtype=float)
        before = est[cl]
        _merge(measurements, index, mbi.LinearMeasurement(y, cl, stddev=meas.scale))
        fresh[cl] = np.clip(y, 0, None)
        rounds.append({"marginal": list(cl), "sigma": meas.scale, "rho": sel_cost + meas_cost})
        if len(fresh) >= BATCH or budget.final:
            model = _refit(estimator, domain, measurements, ow.total, model, [measurements[index[c]] for c in fresh])
            est, fresh, sizes = {}, {}, {}
            after = _model_answer(model, cl)
        else:
            after = fresh[cl]
        budget.spend(sel_cost + meas_cost, float(np.abs(after - before).sum()) <= bias * answers[cl].size)
        # the budget's share spent lags while annealing keeps rounds cheap (a probe: 0.10-0.21
        # for 18 of 20 minutes): the larger of it and the rounds done of the most planned
        done = max(budget.spent / budget.total, len(rounds) / max(details["rounds"], 1))
        progress({"phase": "selecting and measuring marginals", "fraction": round(min(0.1 + 0.7 * done, 0.8), 4),
                  "marginals_measured": len(measurements), "round": len(rounds), "rounds_at_most": details["rounds"]})
    return model, rounds, budget.spent
