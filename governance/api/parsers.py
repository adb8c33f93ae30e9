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

from django.conf import settings
from rest_framework import exceptions, parsers, status
from rest_framework.exceptions import ParseError
from rest_framework.utils import json

from ..core.json_text import (MAX_JSON_DEPTH, SUSPECT_ESCAPE, finite_float, json_problem,  # noqa: F401
                              no_duplicate_keys, string_problem)


class RequestTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "request.too_large"


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser (strict: no NaN or Infinity) with the limits above."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = stream.read().decode(encoding)
            data = json.loads(text, parse_constant=json.strict_constant if self.strict else None,
                              parse_float=finite_float, object_pairs_hook=no_duplicate_keys)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels") from None
        except (ValueError, LookupError) as exc:  # invalid JSON, invalid UTF-8, NaN or Infinity
            raise ParseError(f"JSON parse error - {exc}") from None
        problem = json_problem(data, strings=bool(SUSPECT_ESCAPE.search(text)))
        if problem:
            raise ParseError(f"JSON parse error - {problem}")
        return data


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

