"""JSON text from anywhere outside the API's parser (a web form, a command's file or
argument) read with the API's limits, so that hostile text is a clear error, never a
traceback: at most ``MAX_JSON_DEPTH`` deep (Python's parser raises ``RecursionError``
past ~1,000 levels), no NUL and no lone UTF-16 surrogate in a string, no NaN or
Infinity, no number past a double's range, no integer of more digits than Python
converts, no duplicate key. The API's parsers (``api/parsers.py``) use the same checks."""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_JSON_DEPTH = 100  # events nest at most 16 deep (about 35 JSON levels); schemas and params far less


# A lone surrogate or a NUL can only reach parsed JSON through a \u escape (raw control
# characters are refused by the parser, and UTF-8 cannot encode surrogates): a body without
# one of these escapes needs no walk over its strings.
SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


def json_problem(value: Any, max_depth: int = MAX_JSON_DEPTH, *, strings: bool = True) -> str | None:
    """What makes parsed JSON unsafe to handle, or None. Iterative (no recursion limit);
    the path to the problem is looked up only once one is found. ``strings=False`` checks
    the nesting only (the text had no suspect escape)."""
    if _too_deep(value, max_depth) or (strings and _bad_string(value)):
        return _locate(value, max_depth, None) or "JSON nesting or strings out of bounds"
    return None


def _too_deep(value: Any, max_depth: int) -> bool:
    level = [value] if isinstance(value, (dict, list)) else []
    depth = 0
    while level:
        if depth >= max_depth:
            return True
        depth += 1
        deeper = []
        for v in level:
            deeper.extend([x for x in (v.values() if isinstance(v, dict) else v) if isinstance(x, (dict, list))])
        level = deeper
    return False


def _bad_string(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if string_problem(v):
                return True
        elif isinstance(v, dict):
            if any(isinstance(k, str) and string_problem(k) for k in v):
                return True
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def _locate(value: Any, max_depth: int, where) -> str | None:
    stack: list[tuple[Any, int, tuple | None]] = [(value, 0, where)]
    while stack:
        v, depth, where = stack.pop()
        if isinstance(v, str):
            problem = string_problem(v)
            if problem:
                return f"{problem} (at {_path(where)})"
        elif isinstance(v, (dict, list)):
            if depth >= max_depth:
                return f"JSON nested deeper than {max_depth} levels (at {_path(where)})"
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for key, item in items:
                if isinstance(key, str) and (problem := string_problem(key)):
                    return f"{problem} in a key (at {_path(where)})"
                stack.append((item, depth + 1, (where, key)))
    return None


def string_problem(s: str) -> str | None:
    if "\x00" in s:
        return "strings may not contain NUL characters (\\u0000)"
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            return "strings must be valid Unicode: lone UTF-16 surrogates (\\ud800-\\udfff) are not allowed"
    return None


def _path(where) -> str:
    keys = []
    while where is not None:
        where, key = where
        keys.append(key)
    out = "$"
    for key in reversed(keys):
        out += f"[{key}]" if isinstance(key, int) else "." + (key if key.isascii() and key.isprintable() else "?")
    return out[:200]


def finite_float(text: str) -> float:
    """A JSON number with a fraction or exponent; one past a double's range (1e999) would
    silently become an infinity, one below its smallest (1e-400) a zero."""
    value = float(text)
    if value in (math.inf, -math.inf):
        raise ValueError(f"the number {text[:30]} is beyond the range of a double")
    if underflows(text, value):
        raise ValueError(f"the number {text[:30]} is below the smallest double (it would be read as 0)")
    return value


def underflows(text: str, value: float) -> bool:
    """Whether the number written ``text`` is not zero but was read as ``value`` 0 (an
    officer's budget delta 1e-400 was stored as 0 without a word: a probe)."""
    return value == 0 and any(c in "123456789" for c in text.lower().split("e")[0])


def no_duplicate_keys(pairs: list) -> dict:
    """An object; refused if a key repeats (JSON leaves the meaning open: parsers differ on
    which value wins, so what the analyst meant and what is charged could differ)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"duplicate key {key[:50]!r} in an object")
    return out




def _no_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def loads(text: str) -> Any:
    """Parsed JSON ``text``, or ``ValueError`` saying what is wrong with it."""
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=finite_float,
                           object_pairs_hook=no_duplicate_keys)
    except RecursionError:
        raise ValueError(f"not JSON: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as e:  # invalid JSON, an integer past Python's digit limit, NaN, 1e999, a repeated key
        raise ValueError(f"not JSON: {str(e)[:200]}") from None
    if problem := json_problem(value, strings=bool(SUSPECT_ESCAPE.search(text))):
        raise ValueError(f"not JSON here: {problem}")
    return value
