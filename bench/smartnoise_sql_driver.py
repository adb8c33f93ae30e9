"""Run SQL queries through smartnoise-sql 1.0.10 (snsql) and write its answers as JSON.

Runs in bench/.venv-smartnoise (bench/setup_smartnoise.sh), never in the service's venv
(snsql pins opendp 0.14 and pandas 2). bench/bench_sql.py calls it as a subprocess and
computes every error itself.

    python smartnoise_sql_driver.py spec.json out.json

``spec.json``: {"tables": {name: {"csv": path, "meta": snsql table metadata}},
"queries": [{"id", "table", "sql", "epsilon", "runs"}]}. ``epsilon`` is the query's total:
snsql's own ``get_privacy_cost`` at epsilon 1 says what one query spends (an AVG is a SUM
and a COUNT, ...), and the per-measurement epsilon is scaled so the total equals it.
Each query's table is read as ``PUBLIC.<name>`` (snsql wants a schema); the answer rows
(header first) or the error's first line go to ``out.json``.
"""

from __future__ import annotations

import json
import re
import sys
import warnings


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.load(open(argv[0]))
    import pandas as pd
    import snsql
    from snsql import Privacy

    warnings.filterwarnings("ignore")
    frames = {name: pd.read_csv(t["csv"]) for name, t in spec["tables"].items()}
    metas = {name: {"Collection": {"PUBLIC": {name: t["meta"]}}} for name, t in spec["tables"].items()}
    out = []
    for q in spec["queries"]:
        sql = re.sub(rf"\bFROM\s+{q['table']}\b", f"FROM PUBLIC.{q['table']}", q["sql"], flags=re.IGNORECASE)
        rec = {"id": q["id"], "runs": []}
        meta = metas[q["table"]]
        try:
            probe = snsql.from_df(frames[q["table"]], privacy=Privacy(epsilon=1.0, delta=1e-6), metadata=meta)
            cost, _ = probe.get_privacy_cost(sql)
            eps = q["epsilon"] / cost
            rec["per_measurement_epsilon"] = eps
            for _ in range(q["runs"]):
                reader = snsql.from_df(frames[q["table"]], privacy=Privacy(epsilon=eps, delta=1e-6), metadata=meta)
                rows = reader.execute(sql)
                rec["runs"].append([[_plain(v) for v in r] for r in rows])
            rec["cost"] = reader.get_privacy_cost(sql)
        except Exception as e:  # noqa: BLE001 - what snsql refuses is a result too
            rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        out.append(rec)
    json.dump(out, open(argv[1], "w"))
    return 0


def _plain(v):
    try:
        import numpy as np

        if isinstance(v, np.generic):
            return v.item()
    except ImportError:  # pragma: no cover
        pass
    return v


if __name__ == "__main__":
    raise SystemExit(main())
