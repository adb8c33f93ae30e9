"""List filters that refuse what they do not know.

django-filter ignores a query parameter it has no filter for: a probe's officer asked
``GET /api/requests/?analyst__username=bob`` and was answered all 802 requests, as if they
were bob's. On a list, a parameter that is neither one of its filters nor paging, ordering
or ``format`` is a 400 naming the filters it takes.
"""

from __future__ import annotations

from django_filters.rest_framework import DjangoFilterBackend

from ..core.errors import InvalidRequest

NOT_FILTERS = {"page", "page_size", "ordering", "format"}


class StrictFilterBackend(DjangoFilterBackend):
    def filter_queryset(self, request, queryset, view):
        if getattr(view, "action", None) == "list":
            filterset = self.get_filterset(request, queryset, view)
            known = set(filterset.filters) if filterset is not None else set()
            unknown = sorted(k for k in request.query_params if k not in known | NOT_FILTERS)
            if unknown:
                takes = ", ".join(sorted(known)) or "no filter"
                raise InvalidRequest(
                    f"unknown query parameter{'s' if len(unknown) > 1 else ''} "
                    f"{', '.join(repr(k[:100]) for k in unknown[:10])}: this list takes {takes} "
                    "(and page, page_size, ordering)",
                    errors={k[:100]: "not a filter of this list" for k in unknown[:20]})
        return super().filter_queryset(request, queryset, view)
