"""SQL beside smartnoise-sql: the error of each answer of the SQL suite at equal epsilon.

Runs every answered query of tests/engines/sql_suite.py (CPS1988 and gss_wages, real
survey tables) through the aggregates engine in-process and, in bench/.venv-smartnoise
(bench/setup_smartnoise.sh), through smartnoise-sql 1.0.10 (bench/smartnoise_sql_driver.py),
both at the same total epsilon per query (snsql's per-measurement epsilon scaled by its own
``get_privacy_cost``), ``--runs`` times each. The truth is DuckDB's on the raw table (the
suite's ``truth`` SQL where the engine's meaning differs: population variance, MIN / MAX as
the 1st / 99th percentile). Error of a query: the mean over its cells and runs of
|answer - truth| / |truth| (cells with truth 0 use the absolute error). Both sides get the
same declared bounds (smartnoise clamps to them too); smartnoise is told the domains are
public (``censor_dims: false``) so that it, like the engine, reports every group.

    .venv/bin/python bench/bench_sql.py [--epsilon 1.0] [--runs 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
SN_PY = BENCH / ".venv-smartnoise" / "bin" / "python"
sys.path.insert(0, str(REPO))


def _sn_meta(frame, schema: dict, unit: str | None) -> dict:
    meta = {"rows": len(frame), "row_privacy": True, "censor_dims": False, "clamp_counts": False}
    for name, spec in schema.items():
        if name == unit or spec.get("type") == "unit" or name not in frame.columns:
            continue
        if spec.get("type") == "numeric":
            meta[name] = {"type": "int" if spec.get("integer") else "float", "lower": spec["lower"],
                          "upper": spec["upper"], "nullable": True}
        elif spec.get("type") == "categorical":
            meta[name] = {"type": "string", "nullable": True}
    return meta


def _key(v):
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _errors(rows, truth, n_keys: int) -> list[float] | None:
    """Relative errors of the answer's cells against the truth's (matched by group key)."""
    got = {tuple(_key(v) for v in r[:n_keys]): r for r in rows}
    out = []
    for t in truth:
        if any(v is None for v in t[:n_keys]):
            continue
        r = got.get(tuple(_key(v) for v in t[:n_keys]))
        if r is None:
            return None  # a group missing from the answer
        for a, b in zip(r[n_keys:], t[n_keys:]):
            if a is None or b is None or (isinstance(a, float) and math.isnan(a)):
                return None
            b = float(b)
            out.append(abs(float(a) - b) / (abs(b) if b else 1.0))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import pyarrow as pa

    from engines import plugins
    from engines.aggregates import sql as sqlplan
    from engines.types import DatasetMeta, EngineRequest
    from tests.engines.sql_suite import ANSWER, CASES, tables
    from tests.engines.test_sql_suite import table_of, truth_of

    cases = [c for c in CASES if c.expect == ANSWER]
    loaded = tables()
    ours: dict[str, list[float]] = {}
    n_keys_of: dict[str, int] = {}
    for c in cases:
        frame, schema, unit = loaded[c.table]
        meta = DatasetMeta(c.table, schema, unit, len(frame), len(frame), 1e-6)
        table = pa.Table.from_pandas(frame, preserve_index=False)
        req = sqlplan.translate(_strip_post(c.sql), {"epsilon": args.epsilon})
        request = EngineRequest(req.kind, req.params)
        plan = plugins.plan("aggregates", request, meta)
        truth = _truth_all(c, truth_of)
        errs = []
        for _ in range(args.runs):
            columns, rows, cis = table_of(plugins.run("aggregates", request, meta, table, plan, lambda u: None).result)
            n_keys_of[c.id] = sum(1 for ci in cis[0] if ci is None) if cis else 0
            errs += _errors(rows, truth, n_keys_of[c.id]) or []
        ours[c.id] = errs

    sn: dict[str, dict] = {}
    if SN_PY.exists():
        with tempfile.TemporaryDirectory() as tmp:
            spec = {"tables": {}, "queries": []}
            for name, (frame, schema, unit) in loaded.items():
                path = Path(tmp) / f"{name}.csv"
                frame.to_csv(path, index=False)
                spec["tables"][name] = {"csv": str(path), "meta": _sn_meta(frame, schema, unit)}
            for c in cases:
                sql = _sn_sql(_strip_post(c.sql))
                spec["queries"].append({"id": c.id, "table": c.table, "sql": sql, "epsilon": args.epsilon,
                                        "runs": args.runs})
            (Path(tmp) / "spec.json").write_text(json.dumps(spec))
            proc = subprocess.run([str(SN_PY), str(BENCH / "smartnoise_sql_driver.py"), str(Path(tmp) / "spec.json"),
                                   str(Path(tmp) / "out.json")], capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0:
                print(proc.stderr[-2000:], file=sys.stderr)
            else:
                for rec in json.loads((Path(tmp) / "out.json").read_text()):
                    sn[rec["id"]] = rec

    print(f"SQL suite beside smartnoise-sql 1.0.10: total epsilon {args.epsilon:g} per query, {args.runs} runs; "
          "mean relative error |answer - truth| / |truth| over cells and runs")
    print(f"{'query':26s} {'cells':>5s} {'engine':>10s} {'smartnoise':>11s}  note")
    both = []
    for c in cases:
        e = ours.get(c.id) or []
        mine = statistics.fmean(e) if e else float("nan")
        rec = sn.get(c.id)
        note, theirs = "", float("nan")
        if rec is None:
            note = "smartnoise not run (bench/setup_smartnoise.sh)" if not SN_PY.exists() else "no answer"
        elif "error" in rec:
            note = "smartnoise: " + rec["error"][:70]
        else:
            errs = []
            truth = _truth_all(c, truth_of)
            for rows in rec["runs"]:
                got = _errors(rows[1:], truth, n_keys_of.get(c.id, 0))
                if got is None:
                    note = "smartnoise: groups missing or null answers"
                    continue
                errs += got
            if errs:
                theirs = statistics.fmean(errs)
                both.append((mine, theirs))
        cells = len(e) // max(args.runs, 1)
        print(f"{c.id:26s} {cells:5d} {mine:10.2e} {theirs:11.2e}  {note}")
    if both:
        wins = sum(1 for a, b in both if a <= b)
        print(f"\nqueries both answered: {len(both)}; engine's error lower or equal on {wins}; "
              f"median error engine {statistics.median(a for a, _ in both):.2e}, "
              f"smartnoise {statistics.median(b for _, b in both):.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps({"ours": ours, "smartnoise": sn}, default=str))
    return 0


def _sn_sql(sql: str) -> str:
    """The same query in the SQL smartnoise reads: GROUP BY the expression, not its alias;
    COUNT(*) for COUNT(1); VARIANCE for VAR_POP (both population variance there)."""
    import sqlglot
    from sqlglot import exp

    tree = sqlglot.parse_one(sql)
    aliases = {a.alias: a.this for a in tree.expressions if isinstance(a, exp.Alias)}
    group = tree.args.get("group")
    if group is not None:
        group.set("expressions", [aliases[e.name].copy() if isinstance(e, exp.Column) and e.name in aliases else e
                                  for e in group.expressions])
    for node in list(tree.find_all(exp.Count)):
        if isinstance(node.this, exp.Literal):
            node.set("this", exp.Star())
    out = tree.sql()
    return out.replace("VARIANCE_POP(", "VARIANCE(").replace("VAR_POP(", "VARIANCE(")


def _strip_post(sql: str) -> str:
    """The query without HAVING / ORDER BY / LIMIT (post-processing: the error is the groups')."""
    for word in (" HAVING ", " ORDER BY ", " LIMIT "):
        i = sql.upper().find(word)
        if i >= 0:
            sql = sql[:i]
    return sql


def _truth_all(case, truth_of):
    """The truth of every group (without the post-processing clauses)."""
    from dataclasses import replace

    if case.truth:
        return truth_of(replace(case, truth=_strip_post(case.truth)))
    return truth_of(replace(case, sql=_strip_post(case.sql)))


if __name__ == "__main__":
    raise SystemExit(main())
