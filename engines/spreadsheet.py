"""Text that a spreadsheet opens as data, not as a formula (OWASP's CSV injection rule).

Used by every CSV this project writes for people to open: the audit export's cells and the
synthetic table's text cells. Plain numbers stay numbers."""

from __future__ import annotations

import re

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def is_plain_number(text: str) -> bool:
    """A plain decimal number, which a spreadsheet reads as a number (float() would also
    accept "-inf", "+nan" and "-1_0", which a spreadsheet runs as formulas)."""
    return _PLAIN_NUMBER.fullmatch(text) is not None


def formula_safe(text: str) -> str:
    """``text`` with a leading ``'`` where a spreadsheet would run it as a formula."""
    if text[:1] in FORMULA_STARTS and not is_plain_number(text):
        return "'" + text
    return text
