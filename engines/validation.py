"""Small checks shared by the built-in engines' parameter validation."""

from __future__ import annotations

import math
from typing import Any

from accounting.events import MAX_EPSILON  # noqa: F401  (every engine's epsilon and rho bound)


def is_number(v: Any) -> bool:
    """A finite JSON number (bool is not a number)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


RUN_ACCOUNTANTS = ("rdp", "pld")  # what calibrates and certifies one run (pld: when the dataset allows it)


def run_accountant_error(accountant: Any, allow_pld: bool) -> str | None:
    """Why ``accountant`` cannot certify one pre-planned run on this dataset, or None."""
    if accountant not in RUN_ACCOUNTANTS:
        return f"must be one of {', '.join(RUN_ACCOUNTANTS)}, got {accountant!r}"
    if accountant == "pld" and not allow_pld:
        return ("this dataset's privacy officer has not allowed PLD certification of runs "
                "(pld_certification); use rdp")
    return None
