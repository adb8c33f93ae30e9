"""A dataset's budget as an officer states it: epsilon, and delta or "auto" (from the units)."""

from __future__ import annotations

from accounting.events import MAX_EPSILON

from ..core.errors import InvalidDataset
from .schema import is_finite_number


def parse_budget(epsilon, delta, n_units: int) -> tuple[float, float, bool]:
    if isinstance(epsilon, bool) or not is_finite_number(epsilon) or not 0 < epsilon <= MAX_EPSILON:
        raise InvalidDataset(f"budget epsilon must be a finite number in (0, {MAX_EPSILON:g}], got {epsilon!r}")
    if delta in (None, "auto"):
        return float(epsilon), auto_delta(n_units), True
    if isinstance(delta, str):
        try:
            delta = float(delta)
        except ValueError:
            raise InvalidDataset(f"budget delta must be a number in [0, 1) or \"auto\", got {delta!r}") from None
    if isinstance(delta, bool) or not is_finite_number(delta) or not 0 <= delta < 1:
        raise InvalidDataset(f"budget delta must be a number in [0, 1) or \"auto\", got {delta!r}")
    return float(epsilon), float(delta), False


def auto_delta(n_units: int) -> float:
    """1 / n^1.2: well below 1/n, the level at which one record could be released whole."""
    return 1.0 / max(n_units, 1) ** 1.2
