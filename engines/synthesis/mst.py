"""MST (McKenna, Miklau & Sheldon 2021) on top of ``mbi`` (private-pgm): measure, select,
estimate a graphical model, sample. The measurements use only the noise the plan paid
for: OpenDP's discrete Gaussian for marginal counts and OpenDP's report-noisy-max for
the selections (see planner.py for the accounting).

Sampling is mbi 2.0's ``synthetic_data`` (randomised rounding along the junction tree),
which shuffles rows within each parent group before filling a child column: the fix of
the trap in mbi 1.x / smartnoise-synth 1.0.8, where columns sharing a parent were filled
in row order and became falsely correlated.
"""

from __future__ import annotations

import itertools

import numpy as np

from engines.aggregates.noise import Noise


def _mbi():
    import jax

    jax.config.update("jax_enable_x64", True)  # mbi's estimators stall in float32 on large tables
    jax.config.update("jax_enable_compilation_cache", False)  # mbi compiles many small programs (its advice)
    import mbi
    from mbi.estimation import MirrorDescent

    return mbi, MirrorDescent


def _noisy_max(scores: np.ndarray, scale: float) -> int:
    import opendp.prelude as dp

    dp.enable_features("contrib")
    m = dp.m.make_noisy_max(dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.linf_distance(T=float),
                            dp.max_divergence(), scale=float(scale))
    return int(m([float(s) for s in scores]))


class _Components:
    def __init__(self, items):
        self.parent = {i: i for i in items}

    def find(self, i):
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a, b):
        self.parent[self.find(a)] = self.find(b)


def marginal_counts(codes: dict[str, np.ndarray], sizes: dict[str, int]) -> dict:
    """The exact counts MST measures or scores: every column's one-way marginal and every
    pair's two-way marginal (group-by counts, additive over disjoint parts of a table:
    a distributed run sums them over partitions, engines/distributed/synthesis.py)."""
    cols = list(codes)
    return {"one": {c: np.bincount(codes[c], minlength=sizes[c]) for c in cols},
            "two": {(a, b): np.bincount(codes[a] * sizes[b] + codes[b], minlength=sizes[a] * sizes[b])
                    for a, b in itertools.combinations(cols, 2)}}


def synthesize(codes: dict[str, np.ndarray], sizes: dict[str, int], details: dict, rows: int, progress,
               iters: int = 1000) -> tuple[dict[str, np.ndarray], dict]:
    """Codes of ``rows`` synthetic rows, and what the run released (the selected pairs)."""
    return synthesize_from_counts(marginal_counts(codes, sizes), sizes, details, rows, progress, iters)


def synthesize_from_counts(counts: dict, sizes: dict[str, int], details: dict, rows: int, progress,
                           iters: int = 1000) -> tuple[dict[str, np.ndarray], dict]:
    """MST from the exact marginals (``marginal_counts``): noise, selection, fit, sample."""
    mbi, MirrorDescent = _mbi()
    cols = list(counts["one"])
    one, two = Noise.from_dict(details["one_way"]), Noise.from_dict(details["two_way"])

    progress({"phase": "measuring one-way marginals", "fraction": 0.05, "marginals_measured": 0})
    measurements, noisy = [], {}
    for c in cols:
        y = np.asarray(one.release(counts["one"][c]), dtype=float)
        noisy[c] = y
        measurements.append(mbi.LinearMeasurement(y, (c,), stddev=one.scale))
    total = max(float(np.mean([np.clip(y, 0, None).sum() for y in noisy.values()])), 1.0)
    prob = {c: np.clip(y, 0, None) / max(np.clip(y, 0, None).sum(), 1e-12) for c, y in noisy.items()}

    progress({"phase": "selecting pairs", "fraction": 0.15, "marginals_measured": len(cols)})
    pairs = list(itertools.combinations(cols, 2))
    error = {}
    for a, b in pairs:  # L1 error of the independence model on each pair (the selection score)
        exact = counts["two"][a, b]
        error[a, b] = float(np.abs(exact - np.outer(prob[a], prob[b]).ravel() * total).sum())
    comps, tree = _Components(cols), []
    for _ in range(len(cols) - 1):
        candidates = [p for p in pairs if comps.find(p[0]) != comps.find(p[1])]
        a, b = candidates[_noisy_max(np.array([error[p] for p in candidates]), details["select_scale"])]
        comps.union(a, b)
        tree.append((a, b))

    for i, (a, b) in enumerate(tree):
        progress({"phase": "measuring two-way marginals", "fraction": round(0.2 + 0.2 * i / len(tree), 4),
                  "marginals_measured": len(cols) + i})
        exact = counts["two"][a, b]
        measurements.append(mbi.LinearMeasurement(np.asarray(two.release(exact), dtype=float), (a, b),
                                                  stddev=two.scale))

    progress({"phase": "fitting the graphical model", "fraction": 0.45, "marginals_measured": len(measurements)})
    # (the numeric columns' fine histograms are measured by measure_fine, before decoding)
    domain = mbi.Domain(cols, [sizes[c] for c in cols])
    model = MirrorDescent().estimate(domain, measurements, known_total=total, iters=iters)
    progress({"phase": "sampling", "fraction": 0.8, "marginals_measured": len(measurements)})
    data = model.synthetic_data(rows).to_dict()
    return {c: np.asarray(data[c], dtype=np.int64) for c in cols}, {"selected_pairs": [list(p) for p in tree]}


def fine_counts(fine_codes: dict[str, np.ndarray], sizes: dict[str, int]) -> dict[str, np.ndarray]:
    """Each numeric column's exact fine histogram (additive over partitions)."""
    return {c: np.bincount(x, minlength=sizes[c]) for c, x in fine_codes.items()}


def measure_fine(fine_codes: dict[str, np.ndarray], sizes: dict[str, int], details: dict) -> dict[str, np.ndarray]:
    """Each numeric column's noisy fine histogram (the plan's ``fine`` measurements)."""
    return measure_fine_counts(fine_counts(fine_codes, sizes), details)


def measure_fine_counts(counts: dict[str, np.ndarray], details: dict) -> dict[str, np.ndarray]:
    if not counts:
        return {}
    noise = Noise.from_dict(details["fine"])
    return {c: np.asarray(noise.release(x), dtype=float) for c, x in counts.items()}
