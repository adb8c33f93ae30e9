"""Published guidance on choosing a budget, turned into numbers for one dataset.

The epsilon ranges follow the common reading of the literature: epsilon <= 1 is "strong"
protection (Dwork-Roth 2014, sec. 3.5; NIST SP 800-226, 2025, which also warns that
large epsilons give weak guarantees); 1-3 is typical of deployed statistical releases;
3-10 is where industry deployments such as per-day telemetry budgets sit, for
low-sensitivity data. delta must be far below 1/n: at delta ~ 1/n a mechanism may
publish one person's record outright (Dwork-Roth 2014, sec. 2.3), so we recommend
1/n^1.2 (the "auto" delta, at most 0.001) and never more than 1/n.
"""

from __future__ import annotations

from .budget import auto_delta

RANGES = {
    "high": (0.1, 1.0, "Health, financial, children's or other special-category data."),
    "medium": (1.0, 3.0, "Personal data whose disclosure would cause moderate harm."),
    "low": (3.0, 10.0, "Low-sensitivity or already widely known attributes."),
}
SMALL_DATASET_UNITS = 5_000


def recommend(n_units: int, sensitivity: str) -> dict:
    lo, hi, meaning = RANGES[sensitivity]
    out = {
        "sensitivity": sensitivity,
        "meaning": meaning,
        "epsilon_range": [lo, hi],
        "privacy_units": n_units,
        "delta_recommended": auto_delta(n_units),
        "delta_max": 1.0 / max(n_units, 1),
        "warnings": [],
        "sources": [
            "Dwork & Roth, The Algorithmic Foundations of Differential Privacy, 2014",
            "NIST SP 800-226, Guidelines for Evaluating Differential Privacy Guarantees, 2025",
        ],
    }
    if n_units < SMALL_DATASET_UNITS:
        out["warnings"].append(
            f"Only {n_units} privacy units (< {SMALL_DATASET_UNITS}): the noise DP needs is large next to "
            "the signal in so few people; expect answers of poor quality at these epsilons.")
    return out
