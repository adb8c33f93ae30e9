"""Model instances from rows read by hand-written SQL on the hot path (the worker's claim,
the API token's lookup), with each value converted as the ORM would give it: the
backend's conversions (e.g. SQLite's booleans and aware datetimes), then the field's own
(JSON, UUIDs)."""

from __future__ import annotations

from django.db import connection


def concrete(model) -> list:
    """The model's columns, in the order ``from_row`` expects them."""
    return list(model._meta.concrete_fields)


def from_row(model, fields, values):
    """An instance of ``model`` from the raw ``values`` of its ``fields``."""
    converted = []
    for f, value in zip(fields, values, strict=True):
        col = f.get_col(model._meta.db_table)
        for convert in connection.ops.get_db_converters(col) + f.get_db_converters(connection):
            value = convert(value, col, connection)
        converted.append(value)
    return model.from_db(connection.alias, [f.attname for f in fields], converted)
