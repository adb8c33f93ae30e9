"""Model instances from rows read by hand-written SQL on the hot path (the worker's claim,
the API token's lookup), with each value converted as the ORM would give it: the
backend's conversions (e.g. SQLite's booleans and aware datetimes), then the field's own
(JSON, UUIDs)."""

from __future__ import annotations

import functools

from django.db import connection


def concrete(model) -> list:
    """The model's columns, in the order ``from_row`` expects them."""
    return list(model._meta.concrete_fields)


def from_row(model, fields, values):
    """An instance of ``model`` from the raw ``values`` of its ``fields``."""
    names, plan = _conversions(model, tuple(fields), connection.alias)
    converted = []
    for (col, converters), value in zip(plan, values, strict=True):
        for convert in converters:
            value = convert(value, col, connection)
        converted.append(value)
    return model.from_db(connection.alias, names, converted)


@functools.cache
def _conversions(model, fields: tuple, alias: str):
    """The attribute names and, per field, its column and converters (the backend's, then
    the field's): the same for every row, so worked out once per (model, fields, database)."""
    plan = []
    for f in fields:
        col = f.get_col(model._meta.db_table)
        plan.append((col, tuple(connection.ops.get_db_converters(col) + f.get_db_converters(connection))))
    return [f.attname for f in fields], plan
