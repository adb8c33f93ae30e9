"""SQL for the aggregates engine: one SELECT planned into the same request a JSON call makes.

``translate(sql, options)`` parses one statement with sqlglot and returns a ``SqlRequest``:
the dataset (the FROM table), the aggregates kind and its ``params`` exactly as a JSON
request would write them. Nothing here reads data or knows Django; the engine's own
``validate``/``make_plan`` then check columns, bounds and domains and price the request,
so a SQL query and its JSON twin give the same event, the same cost and the same
fingerprint (the second one is replayed free).

What is understood (everything else is a ``SqlUnsupported`` naming the part):

- one table: ``FROM name`` (quote names with a hyphen: ``FROM "gss-wages"``);
- one aggregate in the select list, optionally beside the GROUP BY column:
  ``COUNT(*)`` (or ``COUNT(1)``), ``SUM(col)``, ``AVG(col)``, ``VARIANCE(col)`` / ``VAR_POP(col)`` /
  ``VAR_SAMP(col)`` (the engine's variance, the population form), ``MEDIAN(col)``,
  ``QUANTILE(col, q)``, ``APPROX_QUANTILE(col, q)`` and
  ``PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY col)``; an alias is allowed;
- ``WHERE``: predicates joined by AND: ``col op literal`` (=, <>, !=, <, <=, >, >=, either
  side), ``col [NOT] IN (literals)``, ``col BETWEEN a AND b`` (two predicates);
- ``GROUP BY col``: one column (the engine requires a declared domain).

The privacy options (``epsilon``, ``rho``, ``accuracy``, ``mechanism``,
``max_rows_per_unit``, ``candidates``) come beside the SQL, never inside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

MAX_SQL_CHARS = 10_000
#: privacy options that may come with a SQL query (the query's shape comes from the SQL)
OPTION_KEYS = ("epsilon", "rho", "accuracy", "mechanism", "max_rows_per_unit", "candidates")

_COMPARISONS = {exp.EQ: "==", exp.NEQ: "!=", exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">="}
_FLIPPED = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_SIMPLE = {exp.Sum: "sum", exp.Avg: "mean", exp.Variance: "variance", exp.VariancePop: "variance"}


class SqlError(Exception):
    """A query that cannot be planned. ``code`` is stable: ``sql.invalid`` (not SQL, or
    options that clash) or ``sql.unsupported`` (valid SQL this engine does not answer);
    ``part`` names the offending part (``"JOIN"``, ``"OR"``, ``"COUNT(column)"``...)."""

    code = "sql.invalid"

    def __init__(self, message: str, part: str = "", errors: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.part = part
        self.errors = errors or {}


class SqlSyntaxError(SqlError):
    code = "sql.invalid"


class SqlUnsupported(SqlError):
    code = "sql.unsupported"


@dataclass(frozen=True)
class SqlRequest:
    """What a SQL query asks: the same fields as a JSON ``POST /api/requests/`` body."""

    dataset: str
    kind: str
    params: dict[str, Any] = field(default_factory=dict)
    engine: str = "aggregates"

    def as_json(self) -> dict:
        return {"dataset": self.dataset, "engine": self.engine, "kind": self.kind, "params": self.params}


def _unsupported(part: str, why: str) -> SqlUnsupported:
    return SqlUnsupported(f"unsupported SQL: {part}: {why}", part=part)


def translate(sql: str, options: dict | None = None) -> SqlRequest:
    """Plan ``sql`` (one SELECT) with ``options`` (epsilon, ...) into an aggregates request."""
    if not isinstance(sql, str) or not sql.strip():
        raise SqlSyntaxError("sql must be a non-empty string", part="sql")
    if len(sql) > MAX_SQL_CHARS:
        raise SqlSyntaxError(f"sql is longer than {MAX_SQL_CHARS} characters", part="sql")
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise SqlSyntaxError("params must be an object of privacy options", part="params",
                             errors={"params": "must be an object"})
    shape = sorted(set(options) - set(OPTION_KEYS), key=str)
    if shape:
        raise SqlSyntaxError(
            f"with sql, params holds only the privacy options ({', '.join(OPTION_KEYS)}); "
            + "; ".join(_option_problem(k) for k in shape[:10]), part="params",
            errors={str(k)[:100]: _option_problem(k) for k in shape[:10]})
    try:
        statements = [s for s in sqlglot.parse(sql, error_level=sqlglot.ErrorLevel.RAISE) if s is not None]
    except (ParseError, TokenError) as e:
        raise SqlSyntaxError(f"not valid SQL: {_first_line(e)}{_hint(sql)}", part="syntax") from None
    except RecursionError:
        raise SqlSyntaxError("not valid SQL: nested too deeply", part="syntax") from None
    except Exception as e:  # noqa: BLE001 - any other parser failure is still the text's fault, never a 500
        raise SqlSyntaxError(f"not valid SQL: {type(e).__name__}", part="syntax") from None
    if len(statements) != 1:
        raise _unsupported("multiple statements", f"send one SELECT, got {len(statements)} statements")
    tree = statements[0]
    if not isinstance(tree, exp.Select):
        if isinstance(tree, (exp.Query, exp.DML, exp.DDL, exp.Command)):
            name = str(tree.this).split()[0].upper() if isinstance(tree, exp.Command) else tree.key.upper()
            raise _unsupported(name[:60], "only SELECT queries are answered")
        raise SqlSyntaxError(f"not a SELECT statement: {sql.strip()[:100]}", part="syntax")
    _refuse_clauses(tree)
    dataset = _table(tree)
    group_by = _group_by(tree)
    kind, params = _aggregate(tree, group_by)
    where = tree.args.get("where")
    if where is not None:
        params["where"] = _predicates(where.this)
    if group_by is not None:
        params["group_by"] = group_by
    for key in OPTION_KEYS:
        if key in options:
            params[key] = options[key]
    return SqlRequest(dataset=dataset, kind=kind, params=params)


_SHAPE_KEYS = {"where", "group_by", "column", "q", "bins", "kind", "select", "having", "order_by", "limit"}


def _option_problem(key) -> str:
    """Why ``key`` is not a privacy option: a part of the query's shape, or a typo of an option."""
    import difflib

    name = str(key)[:100]
    if name in _SHAPE_KEYS:
        return f"{name!r} comes from the query itself (write it in the SQL)"
    close = difflib.get_close_matches(name, OPTION_KEYS, n=1, cutoff=0.6)
    if close:
        return f"unknown option {name!r}: did you mean {close[0]!r}?"
    return f"unknown option {name!r}"


def _hint(sql: str) -> str:
    """What probably went wrong, for the commonest parse failures."""
    import re

    m = re.search(r"\bFROM\s+([A-Za-z_][\w]*(?:-[\w]+)+)", sql, re.IGNORECASE)
    if m:
        return f' (a table name with a hyphen must be quoted: FROM "{m.group(1)}")'
    return ""


def _first_line(e: Exception) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text.replace("\x1b[4m", "").replace("\x1b[0m", "")[:300]


def _refuse_clauses(tree: exp.Select) -> None:
    named = [("with_", "WITH"), ("joins", "JOIN"), ("having", "HAVING"), ("order", "ORDER BY"),
             ("limit", "LIMIT"), ("offset", "OFFSET"), ("distinct", "DISTINCT"), ("qualify", "QUALIFY"),
             ("windows", "WINDOW"), ("laterals", "LATERAL"), ("into", "INTO"), ("sample", "TABLESAMPLE"),
             ("locks", "FOR UPDATE"), ("pivots", "PIVOT")]
    for arg, part in named:
        if tree.args.get(arg):
            raise _unsupported(part, "a DP aggregate is one table, one aggregate, public filters and groups")
    for node in tree.walk():
        if isinstance(node, (exp.Subquery, exp.Union, exp.Intersect, exp.Except)) or (
                isinstance(node, exp.Select) and node is not tree):
            raise _unsupported("subquery", "one SELECT over one table")
        if isinstance(node, exp.Window):
            raise _unsupported("window function (OVER)", "one aggregate over the table or its groups")


def _table(tree: exp.Select) -> str:
    src = tree.args.get("from_") or tree.args.get("from")
    if src is None:
        raise _unsupported("SELECT without FROM", "name the dataset: SELECT ... FROM dataset")
    table = src.this
    if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
        raise _unsupported("FROM " + src.this.sql()[:100], "FROM names one dataset")
    if table.args.get("db") or table.args.get("catalog"):
        raise _unsupported("qualified table name", "FROM names one dataset, without a schema")
    if table.args.get("alias") is not None:
        # an alias is harmless, but qualified columns would then need resolving: keep one rule
        raise _unsupported("table alias", "write FROM dataset without an alias")
    return table.name


def _column(node: exp.Expression, where: str) -> str:
    if isinstance(node, exp.Paren):
        return _column(node.this, where)
    if not isinstance(node, exp.Column) or not isinstance(node.this, exp.Identifier):
        raise _unsupported(f"expression {node.sql()[:100]} in {where}",
                           "only plain column names (no arithmetic, casts or functions)")
    if node.args.get("table") is not None:
        raise _unsupported(f"qualified column {node.sql()[:100]}", "write the column name alone")
    return node.name


def _group_by(tree: exp.Select) -> str | None:
    group = tree.args.get("group")
    if group is None:
        return None
    for arg in ("rollup", "cube", "grouping_sets"):
        if group.args.get(arg):
            raise _unsupported(f"GROUP BY {arg.upper().replace('_', ' ')}", "group by one column")
    cols = group.expressions
    if len(cols) != 1:
        raise _unsupported(f"GROUP BY {len(cols)} columns", "group by one column with a declared domain")
    return _column(cols[0], "GROUP BY")


def _aggregate(tree: exp.Select, group_by: str | None) -> tuple[str, dict]:
    found: list[tuple[str, dict]] = []
    for item in tree.expressions:
        node = item.this if isinstance(item, exp.Alias) else item
        if isinstance(node, exp.Column) and group_by is not None and _column(node, "SELECT") == group_by:
            continue  # the group key, shown beside its value
        if isinstance(node, exp.Column):
            raise _unsupported(f"column {node.sql()[:100]} in SELECT",
                               "select one aggregate, and the GROUP BY column beside it")
        found.append(_one_aggregate(node))
    if not found:
        raise _unsupported("SELECT without an aggregate",
                           "select COUNT(*), SUM, AVG, VARIANCE, MEDIAN, QUANTILE or PERCENTILE_CONT")
    if len(found) > 1:
        raise _unsupported(f"{len(found)} aggregates in one query",
                           "one aggregate per query (each is its own release and charge)")
    return found[0]


def _one_aggregate(node: exp.Expression) -> tuple[str, dict]:
    if isinstance(node, exp.Count):
        inner = node.this
        if isinstance(inner, exp.Star) or (isinstance(inner, exp.Literal) and not inner.is_string):
            return "count", {}  # COUNT(*), COUNT(1): rows
        if isinstance(inner, exp.Distinct):
            raise _unsupported("COUNT(DISTINCT ...)", "distinct counts are not answered; use COUNT(*)")
        raise _unsupported("COUNT(column)", "counts of non-null values are not answered; use COUNT(*)")
    for cls, kind in _SIMPLE.items():
        if type(node) is cls:
            return kind, {"column": _column(node.this, node.key.upper())}
    if isinstance(node, exp.Median):
        return "quantile", {"column": _column(node.this, "MEDIAN"), "q": 0.5}
    if isinstance(node, (exp.Quantile, exp.ApproxQuantile)):
        q = node.args.get("quantile")
        return "quantile", {"column": _column(node.this, "QUANTILE"), "q": _probability(q)}
    if isinstance(node, exp.WithinGroup):
        fn, order = node.this, node.expression
        if isinstance(fn, exp.PercentileCont) and isinstance(order, exp.Order) and len(order.expressions) == 1:
            ordered = order.expressions[0]
            if ordered.args.get("desc"):
                raise _unsupported("ORDER BY ... DESC in PERCENTILE_CONT", "order ascending")
            return "quantile", {"column": _column(ordered.this, "PERCENTILE_CONT"), "q": _probability(fn.this)}
        raise _unsupported(f"{fn.sql()[:60]} WITHIN GROUP",
                           "PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY column) is the one form answered")
    name = node.sql_name() if isinstance(node, exp.Func) else node.sql()
    raise _unsupported(f"{name[:60]}", "not an aggregate this engine answers: COUNT(*), SUM, AVG, VARIANCE, "
                                       "MEDIAN, QUANTILE, PERCENTILE_CONT")


def _probability(node: Any) -> float:
    value = _literal(node, "a quantile") if node is not None else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _unsupported("quantile level", "give the level as a number literal in (0, 1)")
    return float(value)


def _literal(node: exp.Expression, where: str):
    if isinstance(node, exp.Paren):
        return _literal(node.this, where)
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        value = _literal(node.this, where)
        return -value
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Literal):
        if node.is_string:
            return node.this
        text = node.this
        try:
            return int(text) if text.lstrip("+-").isdigit() else float(text)
        except ValueError:
            raise _unsupported(f"number {text[:60]}", "not a number") from None
    if isinstance(node, exp.Null):
        raise _unsupported("NULL", "predicates compare with values; NULL tests are not answered")
    raise _unsupported(f"{node.sql()[:100]} in {where}", "compare columns with literal values only")


def _predicates(node: exp.Expression) -> list[dict]:
    if isinstance(node, exp.Paren):
        return _predicates(node.this)
    if isinstance(node, exp.And):
        return _predicates(node.this) + _predicates(node.expression)
    if isinstance(node, exp.Or):
        raise _unsupported("OR", "WHERE joins predicates with AND (use IN for alternatives of one column)")
    if isinstance(node, exp.Not):
        inner = node.this.this if isinstance(node.this, exp.Paren) else node.this
        if isinstance(inner, exp.In):
            return [_in(inner, negate=True)]
        raise _unsupported("NOT", "negate with <> or NOT IN")
    if isinstance(node, exp.In):
        return [_in(node, negate=False)]
    if isinstance(node, exp.Between):
        column = _column(node.this, "BETWEEN")
        return [{"column": column, "op": ">=", "value": _literal(node.args["low"], "BETWEEN")},
                {"column": column, "op": "<=", "value": _literal(node.args["high"], "BETWEEN")}]
    for cls, op in _COMPARISONS.items():
        if type(node) is cls:
            left, right = node.this, node.expression
            if isinstance(left, exp.Column) and not isinstance(right, exp.Column):
                return [{"column": _column(left, "WHERE"), "op": op, "value": _literal(right, "WHERE")}]
            if isinstance(right, exp.Column) and not isinstance(left, exp.Column):
                return [{"column": _column(right, "WHERE"), "op": _FLIPPED[op], "value": _literal(left, "WHERE")}]
            raise _unsupported(f"predicate {node.sql()[:100]}", "compare one column with one literal")
    if isinstance(node, exp.Is):
        raise _unsupported("IS [NOT] NULL", "NULL tests are not answered")
    if isinstance(node, (exp.Like, exp.ILike)):
        raise _unsupported("LIKE", "compare with = or IN over the declared domain")
    raise _unsupported(f"predicate {node.sql()[:100]}", "WHERE takes column comparisons, IN and BETWEEN")


def _in(node: exp.In, negate: bool) -> dict:
    if node.args.get("query") is not None:
        raise _unsupported("subquery", "IN takes a list of literals")
    values = [_literal(v, "IN") for v in node.expressions]
    if not values:
        raise _unsupported("IN ()", "IN takes at least one literal")
    return {"column": _column(node.this, "IN"), "op": "not_in" if negate else "in", "value": values}
