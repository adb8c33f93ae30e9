"""``Client.sql(..., dummy=True)``: the query run locally with DuckDB on dummy rows.

The dummy rows are the service's ``preview``: generated from the dataset's public schema
alone, never from its stored rows, so the answer says nothing about the data and costs
nothing. The query is first priced by the service (``estimate_sql``, free), which also
checks it exactly as a real run would (unsupported SQL, literals outside the declared
domain, ... raise the same errors) and says which request it becomes; DuckDB then runs the
same SQL on the dummy rows (an aggregate of one column, grouped by one or not: the request
it became, written back as SQL) and the answer is put in the shape of the service's release, so
``Result.df`` has the same columns as the real answer's (its intervals are empty: no noise
was added). Needs DuckDB: ``pip install './client[dummy]'``.

Where the engine's meaning differs from DuckDB's, the query is adjusted before it runs:
VARIANCE is the population variance (``VAR_POP``); MIN / MAX are the 1st / 99th
percentile, as the engine answers them; QUANTILE(col, q) is ``QUANTILE_CONT``.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

from .results import Result

DEFAULT_ROWS = 1000

_REWRITES = [
    (re.compile(r"\bVAR_SAMP\s*\(", re.IGNORECASE), "VAR_POP("),
    (re.compile(r"\bVARIANCE\s*\(", re.IGNORECASE), "VAR_POP("),
    (re.compile(r"\b(?:APPROX_)?QUANTILE\s*\(", re.IGNORECASE), "QUANTILE_CONT("),
    (re.compile(r"\bMIN\s*\(([^()]*)\)", re.IGNORECASE), r"QUANTILE_CONT(\1, 0.01)"),
    (re.compile(r"\bMAX\s*\(([^()]*)\)", re.IGNORECASE), r"QUANTILE_CONT(\1, 0.99)"),
    # DuckDB has no SYMMETRIC: the bounds in either order
    (re.compile(r"\bBETWEEN\s+SYMMETRIC\s+([^\s()]+)\s+AND\s+([^\s()]+)", re.IGNORECASE),
     r"BETWEEN LEAST(\1, \2) AND GREATEST(\1, \2)"),
]


_QUOTED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"")  # a string literal or a quoted name


def duckdb_sql(sql: str) -> str:
    """``sql`` with the engine's meanings spelled for DuckDB, outside its quoted text: a
    label ``'MIN(x)'`` (or a filter ``site = 'MAX(x)'``) came back rewritten (a probe)."""
    quoted: list[str] = []

    def hold(m: re.Match) -> str:
        quoted.append(m.group(0))
        return f"\x00{len(quoted) - 1}\x00"

    masked = _QUOTED.sub(hold, sql) if "\x00" not in sql else sql  # (the service refuses a NUL)
    for pattern, repl in _REWRITES:
        masked = pattern.sub(repl, masked)
    return re.sub("\x00([0-9]+)\x00", lambda m: quoted[int(m.group(1))], masked)


def priced(options: dict) -> dict:
    """``options`` with a budget to price them by if they name none (free; nothing is spent)."""
    if not any(options.get(k) is not None for k in ("epsilon", "rho", "accuracy")):
        return {**options, "epsilon": 1.0}
    return options


def run(client: "Client", sql: str, dataset: str, rows: int = DEFAULT_ROWS, seed: int = 0, estimate=None,
        **options: Any) -> Result:
    """``sql`` run on dummy rows; ``estimate``: the request's own, when it was asked as JSON
    (``Client.run``), else the SQL is priced here."""
    try:
        import duckdb
    except ImportError:  # pragma: no cover - depends on the install
        raise ImportError("dummy=True runs the query locally with DuckDB: pip install './client[dummy]' "
                          "(or pip install duckdb)") from None
    if estimate is None:
        estimate = client.estimate_sql(sql, dataset=dataset, **priced(options))
    request = estimate.request or {}
    params = request.get("params") or {}
    if request.get("engine", "aggregates") == "aggregates" and request.get("kind") in _AGG and \
            isinstance(params.get("group_by", ""), str):
        # the request the service made of the SQL, as SQL with its key first and its value
        # last, as ``_release`` reads them: the analyst's own put them anywhere (a probe's
        # ``SELECT COUNT(*), site ... GROUP BY site``, or no key selected: every group 0)
        sql, _ = sql_of(dataset, "aggregates", request["kind"], params)
    frame = client.preview(dataset, rows=rows, seed=seed)
    folded: dict = {}
    for name in frame.columns:
        folded.setdefault(str(name).lower(), []).append(str(name))
    clash = next((names for names in folded.values() if len(names) > 1), None)
    if clash:  # DuckDB folds quoted names too: "grp" would read "Grp" (a probe's dummy answers did)
        raise ValueError(f"dummy=True cannot run on {dataset!r}: its columns {', '.join(map(repr, clash))} differ "
                         "only in case, which DuckDB does not tell apart; the service does (run it without dummy)")
    con = duckdb.connect()
    try:
        con.register(dataset, frame)
        try:
            out = con.execute(duckdb_sql(sql))
        except duckdb.Error as e:  # the service planned it; DuckDB's dialect differs
            raise ValueError(f"dummy=True: DuckDB could not run this query ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:300]}); the service accepts it (estimate_sql priced it)") from e
        names = [d[0] for d in out.description]
        answer = [list(r) for r in out.fetchall()]
    finally:
        con.close()
    result = _release(request, names, answer)
    if "groups" in result:  # the real release's groups: the declared domain, in its order
        result["groups"] = _declared_groups(client, dataset, result)
    body = {"id": "dummy", "dataset": dataset, "engine": "aggregates", "kind": request.get("kind"),
            "params": request.get("params") or {}, "status": "succeeded", "progress": {}, "event": None,
            "charge": {}, "replayed": False, "error": None, "result": result, "dummy": True,
            "dummy_rows": {"rows": rows, "seed": seed}, "estimate": estimate.raw}
    return Result(body, client)


def _declared_groups(client: "Client", dataset: str, result: dict) -> list[dict]:
    """A one-key answer's groups as the service lists them: every value of the key's
    declared domain, in its order (DuckDB gives those present in the dummy rows, in any
    order); an empty group's count or sum is 0, any other aggregate None. A key without a
    declared domain keeps DuckDB's groups."""
    column = next((c for c in client.dataset(dataset).columns if c.get("name") == result.get("group_by")), {})
    domain = column.get("domain")
    lo, hi = column.get("lower"), column.get("upper")
    if not isinstance(domain, list) and column.get("integer") is True and all(
            isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) for b in (lo, hi)):
        domain = list(range(math.ceil(lo), math.floor(hi) + 1))  # an integer key: every integer in the bounds
    if not isinstance(domain, list):
        return result["groups"]
    found = {int(g["key"]) if isinstance(g["key"], float) and g["key"].is_integer() else g["key"]: g
             for g in result["groups"]}  # (DuckDB's 18.0 of a float column is the label 18)
    empty = 0 if result.get("kind") in ("count", "sum") else None
    return [{**found[v], "key": v} if v in found else {"key": v, "value": empty, "ci95": None} for v in domain]


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        try:
            return v.item()
        except (ValueError, AttributeError):
            return v
    return v


def _release(request: dict, names: list[str], answer: list[list]) -> dict:
    """DuckDB's answer in the shape of the service's release of ``request``."""
    kind = request.get("kind")
    params = request.get("params") or {}
    answer = [[_plain(v) for v in row] for row in answer]
    if kind == "query":
        select = params.get("select") or []
        columns = [it.get("name") for it in select] if len(select) == len(names) else names
        aggregates = [{"name": it.get("name"), "agg": it.get("agg"), "column": it.get("column")}
                      for it in select if "agg" in it]
        return {"kind": "query", "columns": columns, "rows": answer, "ci95": [[None] * len(columns) for _ in answer],
                "aggregates": aggregates, "group_by": [g.get("column") for g in params.get("group_by") or []],
                "dummy": True}
    if params.get("group_by"):
        return {"kind": kind, "group_by": params["group_by"], "dummy": True,
                "groups": [{"key": row[0] if len(row) > 1 else None, "value": row[-1], "ci95": None}
                           for row in answer]}
    value = answer[0][-1] if answer and answer[0] else None
    return {"kind": kind, "value": value, "ci95": None, "dummy": True}



_AGG = {"count": "COUNT(*)", "sum": "SUM({c})", "mean": "AVG({c})", "variance": "VARIANCE({c})",
        "quantile": "QUANTILE({c}, {q})"}
_OPS = {"==": "=", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">=", "in": "IN", "not_in": "NOT IN"}
SHAPE_KEYS = ("column", "q", "where", "group_by")


def _ident(name: str) -> str:
    return '"' + str(name).replace('"', '""') + '"'


def _lit(v: Any) -> str:
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, (int, float)):
        return repr(v)
    return "'" + str(v).replace("'", "''") + "'"


def _where(preds: list) -> str:
    out = []
    for p in preds:
        if "or" in p:
            out.append("(" + " OR ".join("(" + _where(b) + ")" for b in p["or"]) + ")")
        elif "not" in p:
            out.append("NOT (" + _where(p["not"]) + ")")
        elif p["op"] in ("is_null", "is_not_null"):
            out.append(f"{_ident(p['column'])} IS {'NOT ' if p['op'] == 'is_not_null' else ''}NULL")
        elif p["op"] in ("like", "ilike"):  # the JSON's pattern escapes with a backslash
            out.append(f"{_ident(p['column'])} {p['op'].upper()} {_lit(p['value'])} ESCAPE '\\'")
        elif isinstance(p["value"], dict):  # another column
            out.append(f"{_ident(p['column'])} {_OPS[p['op']]} {_ident(p['value']['column'])}")
        elif p["op"] in ("in", "not_in"):
            out.append(f"{_ident(p['column'])} {_OPS[p['op']]} ({', '.join(_lit(v) for v in p['value'])})")
        else:
            out.append(f"{_ident(p['column'])} {_OPS[p['op']]} {_lit(p['value'])}")
    return " AND ".join(out)


def check_runs_on_dummy_rows(engine: str, kind: str) -> None:
    """A ValueError unless the request is one ``dummy=True`` can run (a training was
    refused "unknown parameter(s) for train: epsilon", a parameter nobody gave)."""
    if engine != "aggregates" or kind not in _AGG:
        raise ValueError(f"dummy=True runs aggregates as SQL: count, sum, mean, variance, quantile; not "
                         f"{engine}.{kind} (try a histogram as a GROUP BY query with sql(..., dummy=True); "
                         "price a training or a synthesis with estimate(...))")


def sql_of(dataset: str, engine: str, kind: str, params: dict) -> tuple[str, dict]:
    """An aggregates request (JSON) as the SQL it equals, and its privacy options."""
    check_runs_on_dummy_rows(engine, kind)
    if kind == "count" and params.get("column") is not None:  # COUNT(column): its non-null values
        agg = f"COUNT({_ident(params['column'])})"
    else:
        agg = _AGG[kind].format(c=_ident(params.get("column", "")), q=_lit(params.get("q", 0.5)))
    by = params.get("group_by")
    sql = "SELECT " + (f"{_ident(by)}, " if by else "") + agg + f" FROM {_ident(dataset)}"
    if params.get("where"):
        sql += " WHERE " + _where(params["where"])
    if by:
        sql += f" GROUP BY {_ident(by)}"
    return sql, {k: v for k, v in params.items() if k not in SHAPE_KEYS}
