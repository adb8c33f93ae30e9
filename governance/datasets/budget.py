"""A dataset's budget as an officer states it: epsilon, and delta or "auto" (from the units)."""

from __future__ import annotations

import re

from accounting.events import MAX_EPSILON

from ..core.errors import InvalidDataset
from ..core.json_text import underflows
from .schema import is_finite_number


AUTO_DELTA_MAX = 1e-3  # "auto" on a small table: 1/n^1.2 would be 1 for one unit, 0.06 for ten
MAX_DELTA = 0.1  # the engines refuse a request's own delta above this too


_PLAIN_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def is_plain_number(text: str) -> bool:
    """A plain decimal number in ASCII digits (spaces around allowed): Python's float() also
    reads "1_000" (1000.0), "0x1"-free but full-width and Arabic-Indic digits ("１" is 1.0),
    which forms and the API took as budgets and caps of another number than was shown; nor
    one so small it would be read as 0 (1e-400)."""
    return bool(_PLAIN_NUMBER.fullmatch(text.strip())) and not underflows(text.strip(), float(text))


def parse_budget(epsilon, delta, n_units: int) -> tuple[float, float, bool]:
    """(epsilon, delta, delta is "auto") of a budget an officer states for ``n_units``
    units. A delta of 1/n or more lets a mechanism release one unit's record whole, so an
    explicit delta must stay below 1/n and MAX_DELTA."""
    if isinstance(epsilon, bool) or not is_finite_number(epsilon) or not 0 < epsilon <= MAX_EPSILON:
        raise InvalidDataset(f"budget epsilon must be a finite number in (0, {MAX_EPSILON:g}], got {epsilon!r}")
    if delta in (None, "auto"):
        return float(epsilon), auto_delta(n_units), True
    top = min(MAX_DELTA, 1.0 / max(n_units, 1))
    wrong = f"budget delta must be a number in [0, {top:.3g}) (below 1/n for {max(n_units, 1):,} units) or \"auto\""
    if isinstance(delta, str):
        # a plain decimal number in ASCII digits: Python's float() also reads "1_0e-6" and
        # full-width digits, which an officer's form accepted and stored as another number
        if not is_plain_number(delta):
            raise InvalidDataset(f"{wrong}, got {delta!r}")
        delta = float(delta)
    if isinstance(delta, bool) or not is_finite_number(delta) or not 0 <= delta < top:
        raise InvalidDataset(f"{wrong}, got {delta!r}")
    return float(epsilon), float(delta) + 0.0, False  # (+ 0.0: -0.0 is 0)


def auto_delta(n_units: int) -> float:
    """1 / n^1.2, well below 1/n (the level at which one record could be released whole),
    and at most AUTO_DELTA_MAX (on a small table 1/n^1.2 is not far below anything)."""
    return min(1.0 / max(n_units, 1) ** 1.2, AUTO_DELTA_MAX)
