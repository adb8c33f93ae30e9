"""Small checks shared by the built-in engines' parameter validation."""

from __future__ import annotations

import heapq
import math
from typing import Any

from accounting.events import MAX_EPSILON  # noqa: F401  (every engine's epsilon and rho bound)


MAX_UNKNOWN_REPORTED = 10  # unknown parameters named in an error (a hostile request may send a million)


def unknown_keys(params: dict, allowed) -> tuple[list[str], int]:
    """(The first ``MAX_UNKNOWN_REPORTED`` keys of ``params`` not in ``allowed``, in sorted
    order; how many there are in all). Linear in the keys: no sort of a million."""
    extra = [str(k) for k in params if k not in allowed]
    return heapq.nsmallest(MAX_UNKNOWN_REPORTED, extra), len(extra)


def unknown_message(names: list[str], total: int) -> str:
    """``a, b, c`` or ``a, b, ... (1000000 in all)``: at most ``MAX_UNKNOWN_REPORTED`` names,
    each cut to 100 characters."""
    shown = ", ".join(n[:100] for n in names)
    return shown if total <= len(names) else f"{shown}, ... ({total} in all)"


def is_number(v: Any) -> bool:
    """A finite JSON number (bool is not a number)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


RUN_ACCOUNTANTS = ("rdp", "pld")  # what calibrates and certifies one run (pld: when the dataset allows it)


def span_error(lo: float, hi: float) -> str | None:
    """Why bounds lo < hi cannot scale a column, or None: every engine divides by hi - lo,
    which overflows to inf on bounds such as [-1e308, 1e308]."""
    if math.isfinite(float(hi) - float(lo)):
        return None
    return f"its bounds [{lo}, {hi}] span more than the largest number (about 1.8e308)"


def run_accountant_error(accountant: Any, allow_pld: bool) -> str | None:
    """Why ``accountant`` cannot certify one pre-planned run on this dataset, or None."""
    if accountant not in RUN_ACCOUNTANTS:
        return f"must be one of {', '.join(RUN_ACCOUNTANTS)}, got {accountant!r}"
    if accountant == "pld" and not allow_pld:
        return ("this dataset's privacy officer has not allowed PLD certification of runs "
                "(pld_certification); use rdp")
    return None


def run_delta_error(delta: float, dataset_delta: float) -> str | None:
    """A run's own delta above its dataset's: a certificate stated there promised little (a
    delta of 1/n or more lets a mechanism release a unit's rows whole; 0.1 was accepted)."""
    if delta > dataset_delta:
        return f"must be at most the dataset's delta ({dataset_delta!r}), got {delta!r}"
    return None
