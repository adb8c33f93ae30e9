"""Filtered, paginated lists on the web pages (the officer's dataset page, the auditor's
trail): each list filters on its own query parameters and pages on its own."""

from __future__ import annotations

from django.core.paginator import Paginator


def filtered(qs, request, mapping: dict):
    """``qs`` filtered by each query parameter of ``mapping`` (parameter -> field) that is set."""
    for param, field in mapping.items():
        value = request.GET.get(param)
        if value:
            qs = qs.filter(**{field: value})
    return qs


def page(request, param: str, qs, per_page: int = 25):
    """Page ``?param=`` of ``qs`` (the first one for a missing or malformed number, the last
    one beyond the end)."""
    try:
        number = max(1, int(request.GET.get(param, 1)))
    except ValueError:
        number = 1
    return Paginator(qs, per_page).get_page(number)
