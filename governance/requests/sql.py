"""SQL bodies of ``POST /api/requests/``, of a dataset's ``estimate`` and of the officer's
estimate tool: the bridge from the pure planner (engines/aggregates/sql.py) to the
service's errors; and ``price``, what a request (JSON or SQL) would cost, charging nothing.

A SQL body becomes exactly the JSON request an analyst could have written
(``{"dataset", "engine": "aggregates", "kind", "params"}``); from there on it is that
request: same plan, same event, same charge, same fingerprint.
"""

from __future__ import annotations

from engines.aggregates import sql as sqlplan

from ..core.errors import InvalidRequest, SqlInvalid, SqlUnsupported
from ..ledger import estimates
from .submission import given, plan_request


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


def check_aliases(request: sqlplan.SqlRequest, ds) -> None:
    """Refuse a GROUP BY name that is a select-list alias and a column of ``ds`` too (SQL
    binds it to the column; the translation, which does not know the columns, read the
    alias)."""
    name = sqlplan.ambiguous_alias(request, {c["name"] for c in ds.schema.get("columns", [])})
    if name is not None:
        raise SqlUnsupported(f"unsupported SQL: GROUP BY {name}: names a column of the dataset and a select-list "
                             "alias; SQL groups by the column: group by the expression, or give the alias another "
                             "name", part=f"GROUP BY {name}")


def price(ds, user, *, sql: str | None = None, engine: str | None = None, kind: str | None = None,
          params=None) -> dict:
    """``ledger.estimates.estimate`` of the event the request would reserve: planned by its
    engine (no data read), charged nothing; with ``request``, the JSON request it is."""
    if sql is not None:
        translated = from_sql(sql, params or {}, ds.name)
        check_aliases(translated, ds)
        asked = translated.as_json()
    else:
        asked = {"engine": engine, "kind": kind, "params": {} if params is None else params}
    if not isinstance(asked["params"], dict):
        raise InvalidRequest("params must be a JSON object", errors={"params": "must be an object"})
    asked["params"] = given(asked["params"])
    plan = plan_request(ds, asked["engine"], asked["kind"], asked["params"])
    out = estimates.estimate(ds, user, plan.event)
    out["request"] = {k: asked[k] for k in ("engine", "kind", "params")}
    return out
