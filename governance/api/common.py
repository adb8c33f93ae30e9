"""What the API's view modules share. Permission rules (privacy officer = staff; analyst = any other user):

- datasets: officers see and change all; analysts see only active datasets they hold an
  active grant on; nobody gets rows through any endpoint;
- grants: officers manage; analysts list their own;
- ledger: officers see every entry; analysts only their own;
- estimate: anyone who can see the dataset; charges: officers only;
- requests: an analyst sees only their own, and results go only to the analyst who asked.
"""

import functools
import os
import uuid

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection
from django.http import FileResponse

from ..core.raw_rows import concrete, from_row
from ..core.roles import AUDITORS_GROUP, is_auditor, is_officer
from ..models import Dataset, Grant, LedgerEntry, Request

User = get_user_model()


def visible_datasets(user):
    """Officers: every dataset; an analyst: the active ones she holds an active grant on; an
    auditor none (should one hold a grant from before she became one)."""
    qs = Dataset.objects.select_related("budget")
    if is_officer(user):
        return qs
    if is_auditor(user):
        return qs.none()
    return qs.filter(status=Dataset.Status.ACTIVE, grants__analyst=user, grants__revoked_at__isnull=True).distinct()


def own_rows(qs, user):
    """An analyst's own rows of ``qs`` (requests, ledger entries, grants); none for an
    auditor, her own from before she became one included (the docs: auditors see no
    results, requests, ledger entries or grants)."""
    return qs.none() if is_auditor(user) else qs.filter(analyst=user)


def _not_auditor() -> str:
    ug, gr = User.groups.through._meta.db_table, Group._meta.db_table
    return (f"NOT EXISTS (SELECT 1 FROM {ug} JOIN {gr} ON {gr}.id = {ug}.group_id"
            f" WHERE {ug}.user_id = %s AND {gr}.name = %s)")


_NOT_AUDITOR = _not_auditor()  # params: the user's id, AUDITORS_GROUP


def usable_dataset(user, name: str) -> Dataset | None:
    """The dataset named ``name`` if it is in ``visible_datasets(user)``, else None: one
    statement, written out (the request POST's lookup; the ORM's join, DISTINCT and
    ``select_related`` cost ~1.5 ms of Python per POST; the budget row is not needed, the
    gate reads it under its lock). Read on every call: a revoked grant counts at once."""
    d, g = Dataset._meta, Grant._meta
    fields = concrete(Dataset)
    sql = f'SELECT {", ".join(f.column for f in fields)} FROM {d.db_table} WHERE name = %s'
    params = [name]
    if not is_officer(user):
        sql += (f" AND status = %s AND EXISTS (SELECT 1 FROM {g.db_table} WHERE dataset_id = {d.db_table}.id"
                f" AND analyst_id = %s AND revoked_at IS NULL) AND {_NOT_AUDITOR}")  # an auditor uses no dataset
        params += [Dataset.Status.ACTIVE, user.pk, user.pk, AUDITORS_GROUP]
    with connection.cursor() as cur:  # a cursor and raw_rows, not Dataset.objects.raw (~0.3 ms less)
        cur.execute(sql, params)
        row = cur.fetchone()
    return None if row is None else from_row(Dataset, fields, row)


def visible_request(user, pk, *, final_only: bool = False) -> Request | None:
    """The request ``pk`` with its dataset, analyst and ledger entry if ``user`` may see it
    (``RequestViewSet.get_queryset``'s rule: officers all, an analyst their own), else None;
    ``final_only``: only if it is final. One statement, written out: the queryset's three
    joins through the ORM were ~60% of a status read's Python (the GET that polls or
    long-polls). Read on every call, nothing cached."""
    try:
        pk = Request._meta.pk.get_db_prep_value(uuid.UUID(str(pk)), connection)
    except ValueError:
        return None
    parts = _request_parts()
    sql, params = _visible_request_sql(), [pk]
    if not is_officer(user):
        # her own; none to an auditor (an analyst made one keeps no view of her requests)
        sql += f" AND r.analyst_id = %s AND {_NOT_AUDITOR}"
        params += [user.pk, user.pk, AUDITORS_GROUP]
    if final_only:
        sql += f" AND r.status IN ({', '.join(['%s'] * len(Request.FINAL))})"
        params += list(Request.FINAL)
    with connection.cursor() as cur:
        cur.execute(sql, params)
        row = cur.fetchone()
    if row is None:
        return None
    objs, at = [], 0
    for model, fields in parts:
        values = row[at:at + len(fields)]
        at += len(fields)
        objs.append(None if model is LedgerEntry and values[0] is None else from_row(model, fields, values))
    req, req.dataset, req.analyst, req.ledger_entry = objs
    return req


@functools.cache
def _request_parts():
    return [(m, concrete(m)) for m in (Request, Dataset, get_user_model(), LedgerEntry)]


@functools.cache
def _visible_request_sql() -> str:
    (_, rf), (_, df), (user, uf), (_, ef) = _request_parts()
    cols = ", ".join([f"r.{f.column}" for f in rf] + [f"d.{f.column}" for f in df] + [f"u.{f.column}" for f in uf]
                     + [f"e.{f.column}" for f in ef])
    return (f"SELECT {cols} FROM {Request._meta.db_table} r JOIN {Dataset._meta.db_table} d ON d.id = r.dataset_id "
            f"JOIN {user._meta.db_table} u ON u.id = r.analyst_id "
            f"LEFT JOIN {LedgerEntry._meta.db_table} e ON e.id = r.ledger_entry_id WHERE r.id = %s")


class FormatSuffix:
    """The router's format-suffix routes (``/api/datasets/x/estimate.json``) pass ``format``
    to the handler, and the actions here take no such argument (a TypeError: a 500 for any
    user). Keep the suffix for content negotiation only."""

    def dispatch(self, request, *args, **kwargs):
        self._format_suffix = kwargs.pop("format", None)
        return super().dispatch(request, *args, **kwargs)

    def get_format_suffix(self, **kwargs):
        return getattr(self, "_format_suffix", None)


# The types of the files the engines write, by suffix; anything else is bytes. Not the
# host's mime.types: one maps .pt (a model) to application/vnd.snesdev-page-table.
FILE_TYPES = {".csv": "text/csv", ".json": "application/json", ".html": "text/html", ".png": "image/png",
              ".parquet": "application/vnd.apache.parquet", ".pt": "application/octet-stream"}


def file_response(path, name: str) -> FileResponse:
    """A released file as an attachment; text (a synthetic table's CSV, a report) says its
    charset: the engines write UTF-8, and a client without it read a column named
    ``naïve`` as Latin-1."""
    kind = FILE_TYPES.get(os.path.splitext(name)[1].lower(), "application/octet-stream")
    if kind.startswith("text/") or kind == "application/json":
        kind += "; charset=utf-8"
    return FileResponse(open(path, "rb"), as_attachment=True, filename=name, content_type=kind)
