"""JSON values as every supported database stores and gives them back (SQLite's JSON text,
PostgreSQL's jsonb), so that what is hashed before a write is what a later check reads:
the audit trail's records (``ledger.trail``) and a dataset's schema
(``models.StorableJSONField``). Imports nothing of the service."""

from __future__ import annotations

import json
import math

# Python writes a float of magnitude 1e16 or more in exponent form ("1e+16"); PostgreSQL's
# jsonb stores it as a numeric and gives it back without one ("10000000000000000"), which
# Python reads as an int. Below 1e16 (and for exponents below zero) the text comes back as
# the same float. Every float that large is a whole number, so it is kept as that int.
_EXPONENT_FORM = 1e16


def storable(value):
    """``value`` as a JSON value that every supported database stores and gives back
    unchanged, so a record hashes the same after its round trip: a float of magnitude 1e16
    or more becomes the int it equals, -0.0 becomes 0.0 (jsonb has no negative zero), NaN
    and infinities become the strings "NaN", "Infinity" and "-Infinity" (JSON has no such
    numbers), a NUL character becomes U+FFFD and a lone surrogate "?" (jsonb and UTF-8
    hold neither), tuples become lists and keys strings. Iterative: no recursion limit."""
    root = [value]
    stack = [(root, 0)]
    while stack:
        parent, key = stack.pop()
        v = parent[key]
        if isinstance(v, float):
            if not math.isfinite(v):
                parent[key] = "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
            elif abs(v) >= _EXPONENT_FORM:
                parent[key] = int(v)
            elif v == 0.0:
                parent[key] = 0.0
        elif isinstance(v, str):
            parent[key] = storable_text(v)
        elif isinstance(v, dict):
            out = {(storable_text(k) if isinstance(k, str) else json.dumps(k)): item for k, item in v.items()}
            parent[key] = out
            stack.extend((out, k) for k in out)
        elif isinstance(v, (list, tuple)):
            out = list(v)
            parent[key] = out
            stack.extend((out, i) for i in range(len(out)))
    return root[0]


def storable_text(s: str) -> str:
    """``s`` without what PostgreSQL's text and jsonb refuse (NUL) or UTF-8 cannot encode
    (lone surrogates)."""
    if "\x00" in s:
        s = s.replace("\x00", "\ufffd")
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            s = s.encode("utf-8", "replace").decode("utf-8")
    return s
