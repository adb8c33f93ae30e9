"""The privacy audit: a membership-inference attack on canaries, in the same training run.

Method (Steinke, Nasr & Jagielski 2023, "Privacy Auditing with One (1) Training Run"):
``m`` canaries are drawn from the *public* feature space (each numeric feature uniform in
its declared bounds, each categorical uniform over its declared domain, a random label);
each is put in the training set independently with probability 1/2 (secret coin flips).
After training, the attack is the loss threshold: a canary with a low loss is guessed to
have been trained on. The auditor guesses "in" for the k lowest-loss canaries and "out"
for the k highest, abstaining on the rest, for a few k fixed in advance (Bonferroni over
them). If the training run is (epsilon, delta)-DP, the number of correct guesses v of r
is stochastically dominated as in their Theorem 3.1 / Proposition 5.2:

    P[V >= v] <= P[Binomial(r, e^eps / (1 + e^eps)) >= v]
                 + 2 m delta * max_{i=1..v} P[v - i <= Binomial(r, .) < v] / i

so the largest epsilon whose p-value is below beta = 0.05 is a 95%-confidence
**lower bound** on the epsilon the run really has. It must stay below the claimed
epsilon; far below is normal (one-run audits of black-box models are loose), at or above
it means the guarantee is broken.

Why canaries and not the real rows: the canaries and the coin flips are not private data,
so the attack is post-processing of the released model and costs no budget; an attack
on real members vs. held-out rows would read the private data once more and release an
unaccounted statistic. AUC, TPR and FPR are reported too (at the median-loss threshold).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

BETA = 0.05
GUESS_FRACTIONS = (0.05, 0.1, 0.25)  # k / m for each guess set, fixed before seeing scores


def p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """P[>= v correct of r guesses] for an (eps, delta)-DP run with m canaries."""
    p = 1.0 / (1.0 + math.exp(-eps))
    tail = float(stats.binom.sf(v - 1, r, p))
    if delta > 0 and v > 0:
        pmf = stats.binom.pmf(np.arange(v - 1, -1, -1), r, p)  # P[B = v-1], P[B = v-2], ...
        spread = float(np.max(np.cumsum(pmf) / np.arange(1, v + 1)))
        tail += 2 * m * delta * spread
    return min(tail, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, beta: float = BETA) -> float:
    """The largest epsilon that an outcome of v correct of r guesses rejects at level beta."""
    if r == 0 or p_value(m, r, v, 0.0, delta) >= beta:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m, r, v, hi, delta) < beta:
        hi *= 2
        if hi > 1e3:  # pragma: no cover - cannot happen with finite r
            return math.inf
    for _ in range(50):
        mid = (lo + hi) / 2
        if p_value(m, r, v, mid, delta) < beta:
            lo = mid
        else:
            hi = mid
    return lo


def auc(scores_in: np.ndarray, scores_out: np.ndarray) -> float | None:
    """P[score of a member > score of a non-member] (ties count half): Mann-Whitney. None
    (not measurable, JSON null) when every canary's coin fell on one side."""
    if len(scores_in) == 0 or len(scores_out) == 0:
        return None
    u = stats.mannwhitneyu(scores_in, scores_out, alternative="two-sided").statistic
    return float(u / (len(scores_in) * len(scores_out)))


def audit(losses: np.ndarray, included: np.ndarray, delta: float, claimed_epsilon: float | None) -> dict:
    """Audit from each canary's loss under the trained model and its coin flip."""
    m = len(losses)
    scores = -np.asarray(losses, dtype=float)  # higher: more likely trained on
    inc = np.asarray(included, dtype=bool)
    order = np.argsort(-scores, kind="stable")
    beta = BETA / len(GUESS_FRACTIONS)
    best = {"epsilon": 0.0, "guesses": 0, "correct": 0}
    for frac in GUESS_FRACTIONS:
        k = max(1, int(m * frac))
        if 2 * k > m:
            continue
        top, bottom = order[:k], order[-k:]
        v = int(inc[top].sum() + (~inc[bottom]).sum())
        eps = epsilon_lower_bound(m, 2 * k, v, delta, beta)
        if eps > best["epsilon"] or best["guesses"] == 0:
            best = {"epsilon": eps, "guesses": 2 * k, "correct": v}
    thr = np.median(scores)
    guess_in = scores > thr
    tpr = float(guess_in[inc].mean()) if inc.any() else None  # (None: no canary on that side)
    fpr = float(guess_in[~inc].mean()) if (~inc).any() else None
    return {
        "method": "loss-threshold membership inference on canaries, one-run audit (Steinke, Nasr & "
                  "Jagielski 2023)",
        "canaries": m,
        "canaries_included": int(inc.sum()),
        "auc": auc(scores[inc], scores[~inc]),
        "tpr_at_median": tpr,
        "fpr_at_median": fpr,
        "guesses": best["guesses"],
        "correct_guesses": best["correct"],
        "empirical_epsilon_lower_bound": best["epsilon"],
        "confidence": 1 - BETA,
        "claimed_epsilon": claimed_epsilon,
        "consistent": bool(claimed_epsilon is None or best["epsilon"] <= claimed_epsilon),
    }
