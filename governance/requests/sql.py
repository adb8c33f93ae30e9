"""SQL bodies of ``POST /api/requests/`` and of a dataset's ``estimate``: the bridge from the
pure planner (engines/aggregates/sql.py) to the API's errors.

A SQL body becomes exactly the JSON request an analyst could have written
(``{"dataset", "engine": "aggregates", "kind", "params"}``); from there on it is that
request: same plan, same event, same charge, same fingerprint.
"""

from __future__ import annotations

from engines.aggregates import sql as sqlplan

from ..core.errors import InvalidRequest, SqlInvalid, SqlUnsupported


def from_sql(sql: str, options, dataset: str | None = None) -> sqlplan.SqlRequest:
    """The aggregates request ``sql`` asks for, with ``options`` (epsilon, ...). ``dataset``,
    when the caller names one too, must be the table of the FROM clause."""
    try:
        out = sqlplan.translate(sql, options)
    except sqlplan.SqlUnsupported as e:
        raise SqlUnsupported(e.message, part=e.part, errors=e.errors or {"sql": e.message}) from None
    except sqlplan.SqlError as e:
        raise SqlInvalid(e.message, part=e.part, errors=e.errors or {"sql": e.message}) from None
    if dataset is not None and dataset != out.dataset:
        raise InvalidRequest(f"The query reads FROM {out.dataset!r}, but the request names dataset {dataset!r}.",
                             errors={"dataset": f"differs from the query's FROM {out.dataset!r}"})
    return out
