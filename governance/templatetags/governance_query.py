"""Links and forms on a page with several paginated, filtered lists (the officer's dataset
page: ledger and audit trail, each with its filters and its page): each keeps the rest of
the query string, so paging one list keeps every filter and the other list's page."""

from django import template
from django.utils.html import format_html, format_html_join

register = template.Library()


@register.simple_tag(takes_context=True)
def query_with(context, name, value):
    """``?...`` : this request's query string with ``name`` set to ``value`` (every other
    parameter, repeated ones included, kept as it was)."""
    query = context["request"].GET.copy()
    query[name] = value
    return format_html("?{}", query.urlencode())


@register.simple_tag(takes_context=True)
def hidden_query(context, *names):
    """Hidden inputs for this request's query parameters except ``names`` (the form's own
    fields, and the page of the list it filters, which starts again at 1)."""
    query = context["request"].GET
    return format_html_join("", '<input type="hidden" name="{}" value="{}">',
                            ((k, v) for k in query for v in query.getlist(k) if k not in names))
