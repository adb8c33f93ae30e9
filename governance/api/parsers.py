"""Request-body parsers for the API: hostile bodies become a 4xx, never a 500.

- JSON: refused (400 ``request.malformed``) when nested deeper than ``MAX_JSON_DEPTH``
  (Python's parser would raise ``RecursionError`` past ~1,000 levels, and every later
  ``json.dumps`` of the data risks the same), or when a string or key holds a NUL
  character or a lone UTF-16 surrogate (``"\\ud800"`` is legal JSON but not Unicode: it
  cannot be encoded as UTF-8 for the response, the audit hash or the database, and
  PostgreSQL refuses ``\\u0000`` in text and jsonb). Invalid UTF-8, NaN and Infinity are
  refused as by DRF's parser, and so are a number past a double's range (``1e999``, which
  Python would read as an infinity) and an object with a duplicate key; a body over
  Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE`` never gets here (413, see ``errors.py``). Form
  fields that hold JSON text get the same checks (``serializers.SafeJSONField``).
- Multipart: a body whose ``Content-Length`` exceeds ``MAX_UPLOAD_BYTES`` plus
  ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (the table plus the form fields) is refused with 413
  before it is read, instead of being spooled to disk first.
"""

from __future__ import annotations

import math
import re
from typing import Any

from django.conf import settings
from rest_framework import exceptions, parsers, status
from rest_framework.exceptions import ParseError
from rest_framework.utils import json


class RequestTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "request.too_large"


MAX_JSON_DEPTH = 100  # events nest at most 16 deep (about 35 JSON levels); schemas and params far less


# A lone surrogate or a NUL can only reach parsed JSON through a \u escape (raw control
# characters are refused by the parser, and UTF-8 cannot encode surrogates): a body without
# one of these escapes needs no walk over its strings.
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


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


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser (strict: no NaN or Infinity) with the limits above."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = stream.read().decode(encoding)
            data = json.loads(text, parse_constant=json.strict_constant if self.strict else None,
                              parse_float=_finite_float, object_pairs_hook=_no_duplicate_keys)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels") from None
        except (ValueError, LookupError) as exc:  # invalid JSON, invalid UTF-8, NaN or Infinity
            raise ParseError(f"JSON parse error - {exc}") from None
        problem = json_problem(data, strings=bool(_SUSPECT_ESCAPE.search(text)))
        if problem:
            raise ParseError(f"JSON parse error - {problem}")
        return data


def _finite_float(text: str) -> float:
    """A JSON number with a fraction or exponent; one past a double's range (1e999) would
    silently become an infinity."""
    value = float(text)
    if value in (math.inf, -math.inf):
        raise ValueError(f"the number {text[:30]} is beyond the range of a double")
    return value


def _no_duplicate_keys(pairs: list) -> dict:
    """An object; refused if a key repeats (JSON leaves the meaning open: parsers differ on
    which value wins, so what the analyst meant and what is charged could differ)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"duplicate key {key[:50]!r} in an object")
    return out


def form_problem(data) -> str | None:
    """The first NUL or lone surrogate in a form's field names or values (PostgreSQL's text
    cannot hold a NUL: a lookup with one was a 500 there)."""
    for key, values in data.lists():
        for s in (key, *values):
            if isinstance(s, str) and (problem := string_problem(s)):
                return f"{problem} in form field {key[:50]!r}"
    return None


class FormParser(parsers.FormParser):
    """DRF's form parser with the JSON parser's rule on strings (no NUL, no lone surrogate)."""

    def parse(self, stream, media_type=None, parser_context=None):
        data = super().parse(stream, media_type, parser_context)
        if problem := form_problem(data):
            raise ParseError(f"Form parse error - {problem}")
        return data


class MultiPartParser(parsers.MultiPartParser):
    def parse(self, stream, media_type=None, parser_context=None):
        request = (parser_context or {}).get("request")
        meta = getattr(request, "META", {}) if request is not None else {}
        try:
            length = int(meta.get("CONTENT_LENGTH") or 0)
        except (TypeError, ValueError):
            length = 0
        limit = settings.MAX_UPLOAD_BYTES + (settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0)
        if length > limit:
            raise RequestTooLarge(f"The request body ({length} bytes) is larger than MAX_UPLOAD_BYTES "
                                  f"({settings.MAX_UPLOAD_BYTES} bytes) plus the form fields' allowance "
                                  f"(DATA_UPLOAD_MAX_MEMORY_SIZE).")
        parsed = super().parse(stream, media_type, parser_context)
        if problem := form_problem(parsed.data):
            raise ParseError(f"Multipart form parse error - {problem}")
        return parsed

