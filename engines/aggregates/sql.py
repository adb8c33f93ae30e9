"""SQL for the aggregates engine: one SELECT planned into the same request a JSON call makes.

``translate(sql, options)`` parses one statement with sqlglot and returns a ``SqlRequest``:
the dataset (the FROM table), the aggregates kind and its ``params`` exactly as a JSON
request would write them: the simplest shape (one aggregate without an alias, at most one
plain GROUP BY column, predicates joined by AND) as its own kind (count, mean, ...), any
other as the ``query`` kind (query.py). Nothing here reads data or knows Django; the engine's own
``validate``/``make_plan`` then check columns, bounds and domains and price the request,
so a SQL query and its JSON twin give the same event, the same cost and the same
fingerprint (the second one is replayed free).

What is understood (everything else is a ``SqlUnsupported`` naming the part):

- one table: ``FROM name`` (quote names with a hyphen: ``FROM "gss-wages"``);
- aggregates in the select list, beside the GROUP BY keys, each with an optional alias
  (it names the column): ``COUNT(*)`` (or ``COUNT(1)``), ``COUNT(column)``,
  ``COUNT(DISTINCT unit_column)``, ``COUNT(DISTINCT column)`` (public values),
  ``SUM(col)``, ``AVG(col)``, ``VARIANCE(col)`` / ``VAR_POP(col)`` / ``VAR_SAMP(col)`` (the
  engine's variance, the population form), ``MEDIAN(col)``, ``QUANTILE(col, q)``,
  ``APPROX_QUANTILE(col, q)``, ``PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY col)``, ``MIN`` /
  ``MAX`` (the DP quantiles ``MIN_Q`` / ``MAX_Q``);
- ``WHERE``: ``col op literal`` (=, <>, !=, <, <=, >, >=, either side), ``col op col`` (two
  numeric columns), ``col [NOT] IN
  (literals)``, ``col BETWEEN a AND b``, ``col [NOT] [I]LIKE 'pattern' [ESCAPE 'c']`` (on a
  declared domain), joined by AND, OR and NOT;
- ``GROUP BY``: up to 4 keys, each a column with a declared domain (or an integer column
  with bounds: every integer in them), ``FLOOR(col / w) [* m]``
  or ``CASE WHEN col < a THEN 'x' ... ELSE 'z' END`` (bins over the declared bounds), by
  the expression, its alias or its position;
- ``HAVING`` (comparisons of selected columns with literals, AND, OR, NOT), ``ORDER BY`` (nulls
  as the largest value; ``NULLS FIRST`` / ``LAST`` refused) and ``LIMIT``: post-processing
  of the released values (query.py).

Any other part of the parsed tree (a sample, a version, hints, a dialect's clauses) is
refused by name (``_only``): a clause the translator does not read is never dropped.

The privacy options (``epsilon``, ``rho``, ``accuracy``, ``mechanism``,
``max_rows_per_unit``, ``candidates``) come beside the SQL, never inside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from .params import FLIPPED

MAX_SQL_CHARS = 10_000
#: privacy options that may come with a SQL query (the query's shape comes from the SQL)
OPTION_KEYS = ("epsilon", "rho", "accuracy", "mechanism", "max_rows_per_unit", "candidates")

_COMPARISONS = {exp.EQ: "==", exp.NEQ: "!=", exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">="}
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
    # GROUP BY names read as select-list aliases: if one is also a column of the dataset,
    # SQL binds it to the column (``ambiguous_alias``, once the dataset is known)
    alias_keys: tuple[str, ...] = ()

    def as_json(self) -> dict:
        return {"dataset": self.dataset, "engine": self.engine, "kind": self.kind, "params": self.params}


def _unsupported(part: str, why: str) -> SqlUnsupported:
    return SqlUnsupported(f"unsupported SQL: {part}: {why}", part=part)


def translate(sql: str, options: dict | None = None) -> SqlRequest:
    """Plan ``sql`` (one SELECT) with ``options`` (epsilon, ...) into an aggregates request:
    the simplest shape (one unnamed aggregate, at most one plain GROUP BY column, ANDed
    predicates) as the kind it equals (count, sum, ...), anything more as a ``query``."""
    if not isinstance(sql, str) or not sql.strip():
        what = "a number" if isinstance(sql, (int, float)) else type(sql).__name__
        got = "" if isinstance(sql, str) else f", got {what}"
        raise SqlSyntaxError(f"sql must be a non-empty string (one SELECT){got}", part="sql")
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
        raise SqlSyntaxError(f"not valid SQL: {_first_line(e)}{_hint(sql, e)}", part="syntax") from None
    except RecursionError:
        raise SqlSyntaxError("not valid SQL: nested too deeply", part="syntax") from None
    except Exception as e:  # noqa: BLE001 - any other parser failure is still the text's fault, never a 500
        raise SqlSyntaxError(f"not valid SQL: {type(e).__name__}", part="syntax") from None
    if not statements:  # only comments or semicolons: not a query at all
        raise SqlSyntaxError("not valid SQL: no statement (only comments or semicolons)", part="syntax")
    if len(statements) != 1:
        raise _unsupported("multiple statements", f"send one SELECT, got {len(statements)} statements")
    tree = statements[0]
    if not isinstance(tree, exp.Select):
        if isinstance(tree, (exp.Query, exp.DML, exp.DDL, exp.Command)):
            name = str(tree.this).split()[0].upper() if isinstance(tree, exp.Command) else tree.key.upper()
            raise _unsupported(name[:60], "only SELECT queries are answered")
        raise SqlSyntaxError(f"not a SELECT statement: {sql.strip()[:100]}", part="syntax")
    try:
        _refuse_nulls_order(sql)
        return _translate(tree, options)
    except RecursionError:
        raise SqlSyntaxError("not valid SQL: nested too deeply", part="syntax") from None
    except OverflowError:  # a number past float's range where the translator needs a float
        raise _unsupported("a number out of range", "numbers must be within +-1.8e308") from None


def _translate(tree: exp.Select, options: dict) -> SqlRequest:
    _refuse_clauses(tree)
    dataset = _table(tree)
    keys, key_sql, alias_keys = _group_keys(tree)
    items = _select_items(tree, keys, key_sql)
    where_node = tree.args.get("where")
    where = _predicates(where_node.this) if where_node is not None else []
    having = _having(tree, items)
    order_by = _order_by(tree, items)
    limit = _limit(tree)
    aggs = [it for it in items if "agg" in it]
    simple = (len(aggs) == 1 and not aggs[0]["named"] and aggs[0]["agg"] in _SIMPLE_AGGS
              and len(keys) <= 1 and all(set(k) == {"column"} for k in keys)
              and not any(it["named"] for it in items if "group" in it)  # (the simple shape has no key alias)
              and all("column" in p for p in where) and not having and not order_by and limit is None)
    if simple:
        a = aggs[0]
        kind = a["agg"]
        params = {k: v for k, v in a.items() if k in ("column", "q")}
        if where:
            params["where"] = where
        if keys:
            params["group_by"] = keys[0]["column"]
        for key in OPTION_KEYS:
            if key in options:
                params[key] = options[key]
        return SqlRequest(dataset=dataset, kind=kind, params=params, alias_keys=alias_keys)
    select = [{k: v for k, v in it.items() if k not in ("named", "sql")} for it in items]
    params = {"select": select}
    if keys:
        params["group_by"] = keys
    if where:
        params["where"] = where
    if having:
        params["having"] = having
    if order_by:
        params["order_by"] = order_by
    if limit is not None:
        params["limit"] = limit
    for key in OPTION_KEYS:
        if key in options:
            params[key] = options[key]
    return SqlRequest(dataset=dataset, kind="query", params=params, alias_keys=alias_keys)


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


def _hint(sql: str, error: Exception | None = None) -> str:
    """What probably went wrong, for the commonest parse failures."""
    import re

    m = re.search(r"\bFROM\s+([A-Za-z_][\w]*(?:-[\w]+)+)", sql, re.IGNORECASE)
    if m:
        return f' (a table name with a hyphen must be quoted: FROM "{m.group(1)}")'
    if "Required keyword" in str(error or ""):  # a bare column named like a keyword: union, order, ...
        return ' (a column named like an SQL keyword must be quoted: "union", "order")'
    return ""


def _first_line(e: Exception) -> str:
    import re

    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    text = text.replace("\x1b[4m", "").replace("\x1b[0m", "")[:300]
    if text.startswith("Required keyword"):  # sqlglot's own classes: say only where
        where = re.search(r"Line \d+, Col: \d+", text)
        return "an expression is missing" + (f" ({where.group(0)})" if where else "")
    return text


def _refuse_clauses(tree: exp.Select) -> None:
    named = [("with_", "WITH"), ("joins", "JOIN"), ("offset", "OFFSET"), ("distinct", "DISTINCT"), ("qualify", "QUALIFY"),
             ("windows", "WINDOW"), ("laterals", "LATERAL"), ("into", "INTO"), ("sample", "TABLESAMPLE"),
             ("locks", "FOR UPDATE"), ("pivots", "PIVOT")]
    for arg, part in named:
        if tree.args.get(arg):
            raise _unsupported(part, "a DP query is one table, aggregates over public filters and groups; "
                                     "HAVING, ORDER BY and LIMIT act on the released values")
    # Whatever else the parser knows (CONNECT BY, SORT BY, CLUSTER BY, optimizer hints, a
    # dialect's options, ...) would be silently dropped: refused, by what sqlglot calls it
    _only(tree, _SELECT_PARTS, "", "a DP query is SELECT aggregates FROM one dataset [WHERE] [GROUP BY] "
                                   "[HAVING] [ORDER BY] [LIMIT]")
    if isinstance(tree.args.get("limit"), exp.Fetch):
        raise _unsupported("FETCH", "write LIMIT n")
    for arg, label, allowed in (("group", "GROUP BY", {"expressions", "rollup", "cube", "grouping_sets"}),
                                ("order", "ORDER BY", {"expressions"}), ("limit", "LIMIT", {"expression"})):
        if tree.args.get(arg) is not None:
            _only(tree.args[arg], allowed, label, "group by plain keys, order by selected columns, LIMIT n")
    for o in (tree.args["order"].expressions if tree.args.get("order") else []):
        if isinstance(o, exp.Ordered):
            _only(o, {"this", "desc", "nulls_first"}, "ORDER BY", "ORDER BY a selected column [ASC | DESC]")
    for node in tree.walk():
        if isinstance(node, (exp.Subquery, exp.Union, exp.Intersect, exp.Except)) or (
                isinstance(node, exp.Select) and node is not tree):
            raise _unsupported("subquery", "one SELECT over one table")
        if isinstance(node, exp.Window):
            raise _unsupported("window function (OVER)", "one aggregate over the table or its groups")


_SELECT_PARTS = {"expressions", "from_", "from", "where", "group", "having", "order", "limit"}


def _only(node: exp.Expression, allowed: set, label: str, hint: str) -> None:
    """Refuse any part of ``node`` the translator does not read (it would be ignored),
    named by its SQL (or, for a flag such as GROUP BY ALL, ``label`` and its name)."""
    for arg, value in node.args.items():
        if arg not in allowed and value not in (None, False, []):
            values = value if isinstance(value, list) else [value]
            text = " ".join(v.sql() for v in values if isinstance(v, exp.Expression))
            raise _unsupported(text[:100] or f"{label} {arg.strip('_').upper().replace('_', ' ')}".strip(), hint)


def _refuse_nulls_order(sql: str) -> None:
    """ORDER BY ... NULLS FIRST / LAST is parsed into a flag that cannot tell it from the
    default: refused from the tokens (released rows sort nulls as the largest value)."""
    tokens = sqlglot.tokenize(sql)
    for t, after in zip(tokens, tokens[1:]):
        if t.token_type == TokenType.VAR and t.text.upper() == "NULLS" and after.text.upper() in ("FIRST", "LAST"):
            raise _unsupported(f"NULLS {after.text.upper()}", "nulls sort as the largest value: last in ascending "
                                                              "order, first in descending")


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
    # TABLESAMPLE, FOR SYSTEM_TIME AS OF, table hints WITH (NOLOCK), ...: not answerable
    _only(table, {"this"}, "FROM", "FROM names one dataset as it is now, whole (no sample, version or hints)")
    _only(src, {"this"}, "FROM", "FROM names one dataset")
    return table.name


def _unparen(node: exp.Expression) -> exp.Expression:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _column(node: exp.Expression, where: str) -> str:
    if isinstance(node, exp.Paren):
        return _column(node.this, where)
    if not isinstance(node, exp.Column) or not isinstance(node.this, exp.Identifier):
        raise _unsupported(f"expression {node.sql()[:100]} in {where}",
                           "only plain column names (no arithmetic, casts or functions)")
    if node.args.get("table") is not None:
        raise _unsupported(f"qualified column {node.sql()[:100]}", "write the column name alone")
    return node.name


#: MIN and MAX are answered as these DP quantiles (q = 0 or 1 would let every candidate below
#: the smallest value tie at the best score, and the pick would drift to the declared bound)
MIN_Q, MAX_Q = 0.01, 0.99
_SIMPLE_AGGS = ("count", "sum", "mean", "variance", "quantile")
_BINS_HINT = ("group by a column with a declared domain, an integer column with bounds, FLOOR(col / w) * w, "
              "or CASE WHEN col < a THEN 'x' WHEN col < b THEN 'y' ELSE 'z' END")


def _group_keys(tree: exp.Select) -> tuple[list[dict], list[str], tuple[str, ...]]:
    """The GROUP BY keys (JSON), each key's SQL text (to find it in the select list) and the
    names among them read as select-list aliases."""
    group = tree.args.get("group")
    if group is None:
        return [], [], ()
    for arg in ("rollup", "cube", "grouping_sets"):
        if group.args.get(arg):
            raise _unsupported(f"GROUP BY {arg.upper().replace('_', ' ')}", "group by plain keys: " + _BINS_HINT)
    if len(group.expressions) > 4:
        raise _unsupported(f"GROUP BY {len(group.expressions)} keys", "group by at most 4 keys")
    # GROUP BY name: an output alias of an expression (GROUP BY decade, the alias of
    # FLOOR(age / 10) * 10), unless the name is also an input column, which wins as in
    # PostgreSQL (FLOOR(age) AS age ... GROUP BY age groups by age); an aggregate's alias
    # never (COUNT(*) AS site ... GROUP BY site groups by the column site).
    # (input columns: those the select list and WHERE read; ORDER BY and HAVING name outputs)
    inputs = {c.name for part in [*tree.expressions, tree.args.get("where")] if part is not None
              for c in part.find_all(exp.Column)}
    aliases = {item.alias: item.this for item in tree.expressions
               if isinstance(item, exp.Alias) and not item.this.find(exp.AggFunc) and item.alias not in inputs}
    keys, texts, named = [], [], []
    for node in group.expressions:
        if isinstance(node, exp.Column) and not node.args.get("table") and node.name in aliases:
            named.append(node.name)
            node = aliases[node.name]  # GROUP BY decade, the alias of FLOOR(age / 10) * 10
        elif isinstance(node, exp.Literal) and not node.is_string:  # GROUP BY 1: the first selected column
            pos = _literal(node, "GROUP BY")
            if not isinstance(pos, int) or not 1 <= pos <= len(tree.expressions):
                raise _unsupported(f"GROUP BY {node.sql()[:20]}", f"a position between 1 and {len(tree.expressions)}")
            item = tree.expressions[pos - 1]
            node = item.this if isinstance(item, exp.Alias) else item
        key = _group_key(node)
        if key not in keys:  # GROUP BY a, a (or a, 1 naming a) is GROUP BY a: one key, not a x a
            keys.append(key)
            texts.append(_norm(node))
    return keys, texts, tuple(named)


def ambiguous_alias(request: SqlRequest, columns) -> str | None:
    """A GROUP BY name the translation read as a select-list alias that is also one of the
    dataset's ``columns``: SQL binds such a name to the column (``CASE ... END AS "Month"
    ... GROUP BY "Month"`` groups by the column Month, and then the CASE is no group key)."""
    return next((name for name in request.alias_keys if name in columns), None)


def _norm(node: exp.Expression) -> str:
    """The expression's text to match it by, case-folded but for its string literals
    ('LOW' is not 'low': a label of the release) and its names (columns named "Grp" and
    "grp" are two columns, as everywhere else here: a probe's GROUP BY "Grp", "grp" came
    back as two keys of "Grp"), which are kept as their hex; comments are not part of it
    (a probe's ``HAVING cut /* c */ = 'Ideal'`` bound to the output alias, not the key)."""
    node = node.copy()
    for lit in node.find_all(exp.Literal):
        if lit.is_string:
            lit.set("this", lit.this.encode("utf-8", "surrogatepass").hex())
    for name in node.find_all(exp.Identifier):
        name.set("this", "n" + name.this.encode("utf-8", "surrogatepass").hex())
        name.set("quoted", False)
    return node.sql(normalize=True, pretty=False, comments=False).lower()


def _group_key(node: exp.Expression) -> dict:
    if isinstance(node, exp.Paren):
        return _group_key(node.this)
    if isinstance(node, exp.Column):
        return {"column": _column(node, "GROUP BY")}
    mult = 1
    inner = node
    if isinstance(node, exp.Mul):  # FLOOR(col / w) * m, or m * FLOOR(col / w)
        a, b = node.this, node.expression
        if isinstance(b, (exp.Literal, exp.Neg)) and isinstance(a, exp.Floor):
            inner, mult = a, _literal(b, "GROUP BY")
        elif isinstance(a, (exp.Literal, exp.Neg)) and isinstance(b, exp.Floor):
            inner, mult = b, _literal(a, "GROUP BY")
    if isinstance(inner, exp.Floor) and inner.args.get("decimals") is None and inner.args.get("to") is None:
        arg = inner.this.this if isinstance(inner.this, exp.Paren) else inner.this
        if type(arg) is exp.Div:  # (DIV truncates toward zero: not a floor, refused below)
            width = _literal(arg.expression, "GROUP BY")
            if isinstance(width, (int, float)) and not isinstance(width, bool) and width > 0 and \
                    isinstance(mult, (int, float)) and not isinstance(mult, bool):
                return {"column": _column(arg.this, "GROUP BY"), "width": width, "multiplier": mult}
        elif isinstance(arg, exp.Column):
            return {"column": _column(arg, "GROUP BY"), "width": 1, "multiplier": mult}
    if isinstance(node, exp.Case):
        return _case_bins(node)
    raise _unsupported(f"GROUP BY {node.sql()[:100]}", _BINS_HINT)


def _case_bins(node: exp.Case) -> dict:
    """CASE WHEN col < t1 THEN l1 WHEN col < t2 THEN l2 ... ELSE ln END (or <=), thresholds ascending."""
    if node.this is not None:
        raise _unsupported("CASE col WHEN ...", "bin with CASE WHEN col < a THEN ... ELSE ... END")
    default = node.args.get("default")
    if default is None:
        raise _unsupported("CASE without ELSE", "end the bins with ELSE 'label' (every row needs a group)")
    column, ops, thresholds, labels = None, set(), [], []
    for when in node.args.get("ifs") or []:
        cond = when.this
        op = {exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">="}.get(type(cond))
        left, right = (cond.this, cond.expression) if op else (None, None)
        if op in (">", ">=") and isinstance(right, exp.Column):  # t > col  is  col < t
            left, right, op = right, left, {">": "<", ">=": "<="}[op]
        if op not in ("<", "<=") or not isinstance(left, exp.Column):
            raise _unsupported(f"CASE WHEN {cond.sql()[:80]}",
                               "bins are WHEN col < t (or col <= t) with t increasing, then ELSE")
        c = _column(left, "CASE")
        if column not in (None, c):
            raise _unsupported("CASE over two columns", "bin one column per CASE")
        column = c
        ops.add(op)
        thresholds.append(_literal(right, "CASE"))
        labels.append(_literal(when.args["true"], "CASE THEN"))
    labels.append(_literal(default, "CASE ELSE"))
    if len(ops) != 1:
        raise _unsupported("CASE mixing < and <=", "use one comparison for every WHEN")
    if any(not isinstance(t, (int, float)) or isinstance(t, bool) for t in thresholds) or \
            any(a >= b for a, b in zip(thresholds[:-1], thresholds[1:])):
        raise _unsupported("CASE thresholds", "numbers in increasing order")
    return {"column": column, "thresholds": thresholds, "closed": "left" if "<" in ops else "right",
            "labels": labels}


def _select_items(tree: exp.Select, keys: list[dict], key_sql: list[str]) -> list[dict]:
    items: list[dict] = []
    for item in tree.expressions:
        alias = item.alias if isinstance(item, exp.Alias) else None
        node = item.this if isinstance(item, exp.Alias) else item
        text = _norm(node)
        if text in key_sql:
            g = key_sql.index(text)
            name = alias or (keys[g]["column"] if set(keys[g]) == {"column"} else f"{keys[g]['column']}_bin")
            items.append({"name": name, "group": g, "named": bool(alias), "sql": text})
            continue
        if isinstance(node, exp.Column):
            folded = [k["column"] for k in keys if set(k) == {"column"} and k["column"].lower() == node.name.lower()]
            if folded:
                raise _unsupported(f"column {node.sql()[:100]} in SELECT",
                                   f"names are case-sensitive: the GROUP BY key is {folded[0]!r}")
            raise _unsupported(f"column {node.sql()[:100]} in SELECT",
                               "select aggregates, and GROUP BY keys beside them")
        agg, extra, default = _one_aggregate(node)
        items.append({"name": alias or default, "agg": agg, **extra, "named": bool(alias), "sql": text})
    if not any("agg" in it for it in items):
        raise _unsupported("SELECT without an aggregate",
                           "select COUNT(*), COUNT(column), COUNT(DISTINCT column), SUM, AVG, VARIANCE, MIN, MAX, "
                           "MEDIAN, QUANTILE or PERCENTILE_CONT")
    seen = set()
    for it in items:
        if it["name"] in seen:
            raise _unsupported(f"two columns named {it['name']}", "give each an alias: ... AS name")
        seen.add(it["name"])
    return items


def _find(node: exp.Expression, items: list[dict], where: str) -> str:
    """The select item ``node`` refers to: its alias, or the same expression. ORDER BY binds
    a name to an alias first, HAVING to the expression first, as SQL does (``SELECT region
    AS smsa, smsa AS region ... HAVING smsa = 'south'`` filters on the column smsa: a probe's
    was answered on the alias, the region labels)."""
    if isinstance(node, exp.Paren):
        return _find(node.this, items, where)
    text = _norm(node)
    by_alias = isinstance(node, exp.Column) and not node.args.get("table")
    passes = ("sql", "name") if where == "HAVING" else ("name", "sql")
    for key in passes:
        if key == "name" and not by_alias:
            continue
        for it in items:
            if it[key] == (node.name if key == "name" else text):
                return it["name"]
    raise _unsupported(f"{node.sql()[:100]} in {where}",
                       f"{where} refers to the SELECT list's columns (by alias or the same expression); "
                       "select it with an alias first")


def _having(tree: exp.Select, items: list[dict]) -> list[dict]:
    node = tree.args.get("having")
    if node is None:
        return []

    def walk(n) -> list[dict]:
        if isinstance(n, exp.Paren):
            return walk(n.this)
        if isinstance(n, exp.And):
            return walk(n.this) + walk(n.expression)
        if isinstance(n, exp.Or):  # a OR b OR c: one list of branches
            branches = []
            for side in (n.this, n.expression):
                inner = _unparen(side)
                branches += walk(inner)[0]["or"] if isinstance(inner, exp.Or) else [walk(side)]
            return [{"or": branches}]
        if isinstance(n, exp.Not):
            return [{"not": walk(n.this)}]
        for cls, op in _COMPARISONS.items():
            if type(n) is cls:
                left, right = n.this, n.expression
                if isinstance(right, (exp.Literal, exp.Neg, exp.Boolean)):
                    return [{"column": _find(left, items, "HAVING"), "op": op, "value": _literal(right, "HAVING")}]
                if isinstance(left, (exp.Literal, exp.Neg, exp.Boolean)):
                    return [{"column": _find(right, items, "HAVING"), "op": FLIPPED[op],
                             "value": _literal(left, "HAVING")}]
                raise _unsupported(f"HAVING {n.sql()[:80]}", "compare a selected column with a literal")
        raise _unsupported(f"HAVING {n.sql()[:80]}",
                           "HAVING takes comparisons of selected columns with literals, AND, OR and NOT")

    return walk(node.this)


def _order_by(tree: exp.Select, items: list[dict]) -> list[dict]:
    order = tree.args.get("order")
    if order is None:
        return []
    out = []
    for o in order.expressions:
        node = o.this
        if isinstance(node, exp.Literal) and not node.is_string:
            pos = _literal(node, "ORDER BY")
            if not isinstance(pos, int) or not 1 <= pos <= len(items):
                raise _unsupported(f"ORDER BY {pos}", f"a position between 1 and {len(items)}")
            name = items[pos - 1]["name"]
        else:
            name = _find(node, items, "ORDER BY")
        out.append({"column": name, "desc": bool(o.args.get("desc"))})
    return out


def _limit(tree: exp.Select) -> int | None:
    node = tree.args.get("limit")
    if node is None:
        return None
    try:
        value = _literal(node.expression, "LIMIT") if node.expression is not None else None
    except SqlUnsupported:  # LIMIT NULL, LIMIT a column: the part is LIMIT's
        value = None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _unsupported("LIMIT", "LIMIT takes a positive integer literal (LIMIT 0 answers no row, charged)")
    return value


def _one_aggregate(node: exp.Expression) -> tuple[str, dict, str]:
    """(agg, its parameters, the column name it gets without an alias)."""
    if isinstance(node, exp.Count):
        _only(node, {"this", "big_int"}, "COUNT", "COUNT(*), COUNT(column) or COUNT(DISTINCT unit_column)")
        inner = node.this
        if isinstance(inner, exp.Star) or (isinstance(inner, exp.Literal) and not inner.is_string):
            return "count", {}, "count"  # COUNT(*), COUNT(1): rows
        if isinstance(inner, exp.Distinct):
            _only(inner, {"expressions"}, "COUNT(DISTINCT)", "COUNT(DISTINCT column) of one column")
            if len(inner.expressions) != 1:
                raise _unsupported("COUNT(DISTINCT a, b)", "COUNT(DISTINCT column) counts one column's values")
            col = _column(inner.expressions[0], "COUNT(DISTINCT)")
            return "count_distinct", {"column": col}, f"count_distinct_{col}"
        col = _column(inner, "COUNT")  # COUNT(column): the rows where it is not null
        return "count", {"column": col}, f"count_{col}"
    for cls, kind in _SIMPLE.items():
        if type(node) is cls:
            col = _column(node.this, node.key.upper())
            return kind, {"column": col}, {"sum": "sum", "mean": "avg", "variance": "var"}[kind] + "_" + col
    if isinstance(node, (exp.Min, exp.Max)):
        if node.expressions:
            raise _unsupported(f"{node.key.upper()} of several values", "MIN(column) / MAX(column)")
        _only(node, {"this"}, node.key.upper(), "MIN(column) / MAX(column)")
        col = _column(node.this, node.key.upper())
        q = MIN_Q if isinstance(node, exp.Min) else MAX_Q
        return "quantile", {"column": col, "q": q}, f"{node.key.lower()}_{col}"
    if isinstance(node, exp.Median):
        col = _column(node.this, "MEDIAN")
        return "quantile", {"column": col, "q": 0.5}, f"median_{col}"
    if isinstance(node, (exp.Quantile, exp.ApproxQuantile)):
        _only(node, {"this", "quantile"}, "QUANTILE", "QUANTILE(column, q): the engine's own accuracy")
        q = node.args.get("quantile")
        col = _column(node.this, "QUANTILE")
        p = _probability(q)
        return "quantile", {"column": col, "q": p}, f"quantile_{col}_{p:g}"
    if isinstance(node, exp.WithinGroup):
        fn, order = node.this, node.expression
        if isinstance(fn, exp.PercentileCont) and isinstance(order, exp.Order) and len(order.expressions) == 1:
            _only(fn, {"this"}, "PERCENTILE_CONT", "PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY column)")
            ordered = order.expressions[0]
            if ordered.args.get("desc"):
                raise _unsupported("ORDER BY ... DESC in PERCENTILE_CONT", "order ascending")
            col = _column(ordered.this, "PERCENTILE_CONT")
            p = _probability(fn.this)
            return "quantile", {"column": col, "q": p}, f"quantile_{col}_{p:g}"
        raise _unsupported(f"{fn.sql()[:60]} WITHIN GROUP",
                           "PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY column) is the one form answered")
    if isinstance(node, exp.Stddev) or isinstance(node, (exp.StddevPop, exp.StddevSamp)):
        raise _unsupported(f"{node.sql_name()}", "use VARIANCE(column) (its square root is post-processing)")
    name = node.sql_name() if isinstance(node, exp.Func) else node.sql()
    raise _unsupported(f"{name[:60]}", "not an aggregate this engine answers: COUNT(*), COUNT(column), "
                                       "COUNT(DISTINCT column), SUM, AVG, VARIANCE, MIN, MAX, MEDIAN, QUANTILE, "
                                       "PERCENTILE_CONT "
                                       "(arithmetic on aggregates is not answered: compute it from the result)")


def _probability(node: Any) -> float:
    value = _literal(node, "a quantile") if node is not None else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not -1e308 < value < 1e308:
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
        raise _unsupported("NULL", "compare with a value; test nulls with col IS [NOT] NULL")
    raise _unsupported(f"{node.sql()[:100]} in {where}",
                       "compare with a literal value (in WHERE, a column may also be compared with a column)")


def _predicates(node: exp.Expression) -> list[dict]:
    if isinstance(node, exp.Paren):
        return _predicates(node.this)
    if isinstance(node, exp.And):
        return _predicates(node.this) + _predicates(node.expression)
    if isinstance(node, exp.Or):
        branches = []
        for side in (node.this, node.expression):
            inner = side.this if isinstance(side, exp.Paren) else side
            if isinstance(inner, exp.Or):  # a OR b OR c: one list of branches
                branches += _predicates(inner)[0]["or"]
            else:
                branches.append(_predicates(side))
        return [{"or": branches}]
    if isinstance(node, exp.Not):
        inner = node.this.this if isinstance(node.this, exp.Paren) else node.this
        if isinstance(inner, exp.In):
            return [_in(inner, negate=True)]
        if isinstance(inner, exp.Is) and isinstance(inner.expression, exp.Null):  # col IS NOT NULL
            return [{"column": _column(inner.this, "IS NOT NULL"), "op": "is_not_null"}]
        if isinstance(inner, exp.Is):  # IS NOT TRUE / FALSE: named as written
            raise _unsupported(f"IS NOT {inner.expression.sql()[:60]}", "IS tests NULL only: col IS [NOT] NULL")
        return [{"not": _predicates(inner)}]
    if isinstance(node, exp.In):
        return [_in(node, negate=False)]
    if isinstance(node, exp.Between):
        column = _column(node.this, "BETWEEN")
        low, high = _literal(node.args["low"], "BETWEEN"), _literal(node.args["high"], "BETWEEN")
        if node.args.get("symmetric"):  # the bounds in either order
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)):
                raise _unsupported("BETWEEN SYMMETRIC of non-numbers", "BETWEEN SYMMETRIC takes two numbers")
            low, high = min(low, high), max(low, high)
        _only(node, {"this", "low", "high", "symmetric"}, "BETWEEN", "column BETWEEN [SYMMETRIC] a AND b")
        return [{"column": column, "op": ">=", "value": low}, {"column": column, "op": "<=", "value": high}]
    for cls, op in _COMPARISONS.items():
        if type(node) is cls:
            left, right = _unparen(node.this), _unparen(node.expression)  # ("Temp") > 90 is Temp > 90
            if isinstance(left, exp.Column) and not isinstance(right, exp.Column):
                return [{"column": _column(left, "WHERE"), "op": op, "value": _literal(right, "WHERE")}]
            if isinstance(right, exp.Column) and not isinstance(left, exp.Column):
                return [{"column": _column(right, "WHERE"), "op": FLIPPED[op], "value": _literal(left, "WHERE")}]
            if isinstance(left, exp.Column) and isinstance(right, exp.Column):  # two numeric columns
                return [{"column": _column(left, "WHERE"), "op": op, "value": {"column": _column(right, "WHERE")}}]
            raise _unsupported(f"predicate {node.sql()[:100]}", "compare a column with a literal or another column")
    if isinstance(node, exp.Is):
        if not isinstance(node.expression, exp.Null):
            raise _unsupported(f"IS {node.expression.sql()[:60]}", "IS tests NULL only: col IS [NOT] NULL")
        return [{"column": _column(node.this, "IS NULL"), "op": "is_null"}]
    if isinstance(node, exp.Escape) and isinstance(node.this, (exp.Like, exp.ILike)):
        escape = _literal(node.expression, "ESCAPE")
        if not isinstance(escape, str) or len(escape) > 1:
            raise _unsupported(f"ESCAPE {node.expression.sql()[:60]}", "ESCAPE takes one character, or ''")
        return _like(node.this, escape)
    if isinstance(node, (exp.Like, exp.ILike)):
        return _like(node, None)
    raise _unsupported(f"predicate {node.sql()[:100]}",
                       "WHERE takes column comparisons with literals, IN, BETWEEN, AND, OR and NOT")


def _like(node: exp.Like | exp.ILike, escape: str | None) -> list[dict]:
    """``col [NOT] [I]LIKE 'pattern' [ESCAPE 'c']``, the pattern written with backslash
    escapes (the JSON's form). With no ESCAPE a backslash is refused: databases differ on
    whether it escapes (PostgreSQL) or not (the SQL standard)."""
    word = "ILIKE" if isinstance(node, exp.ILike) else "LIKE"
    _only(node, {"this", "expression", "negate"}, word, f"column [NOT] {word} 'pattern' [ESCAPE 'c']")
    if not isinstance(_unparen(node.this), exp.Column):
        raise _unsupported(f"{word} {node.sql()[:100]}", f"column {word} 'pattern': a column on the left")
    column = _column(_unparen(node.this), word)
    pattern = _literal(node.expression, word)
    if not isinstance(pattern, str):
        raise _unsupported(f"{word} of a non-string", f"{word} takes a string pattern")
    if word == "ILIKE" and escape and escape.lower() != escape.upper():
        raise _unsupported(f"ESCAPE {escape!r} with ILIKE", "a letter as ILIKE's escape is case-folded by some "
                           "databases (DuckDB) and not by others: use a character that is not a letter")
    if escape is None and "\\" in pattern:
        raise _unsupported(f"backslash in {word}", "say what a backslash means: add ESCAPE '\\' (or ESCAPE '')")
    out, i = [], 0
    while i < len(pattern):  # to backslash escapes: the escape makes the next character literal
        c = pattern[i]
        if escape and c == escape:
            if i + 1 == len(pattern):
                raise _unsupported(f"ESCAPE {escape!r}", "the pattern ends with its escape character")
            out.append("\\" + pattern[i + 1])
            i += 2
            continue
        out.append("\\\\" if c == "\\" else c)
        i += 1
    p = {"column": column, "op": word.lower(), "value": "".join(out)}
    return [{"not": [p]}] if node.args.get("negate") else [p]


def _in(node: exp.In, negate: bool) -> dict:
    if node.args.get("query") is not None:
        raise _unsupported("subquery", "IN takes a list of literals")
    _only(node, {"this", "expressions"}, "IN", "column IN (literal, ...)")
    values = [_literal(v, "IN") for v in node.expressions]
    if not values:
        raise _unsupported("IN ()", "IN takes at least one literal")
    return {"column": _column(node.this, "IN"), "op": "not_in" if negate else "in", "value": values}
