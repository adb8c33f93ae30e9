"""Small checks shared by the built-in engines' parameter validation."""

from __future__ import annotations

import math
from typing import Any


def is_number(v: Any) -> bool:
    """A finite JSON number (bool is not a number)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False
