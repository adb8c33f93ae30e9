#!/usr/bin/env python3
"""A dataset's refined RDP report over a ledger of many distinct Laplace releases: the
curves evaluated one by one (as before 2026-12-01) and in numpy blocks, side by side.

    .venv/bin/python bench/bench_refined_report.py [--sizes 1000,13500,50000]

A ledger where analysts choose their own epsilons has one Laplace event per distinct
epsilon (a probe's year of history: 13,500 on one dataset, whose page and
``GET /api/datasets/{name}/`` took 10 s). ``accounting.refine.refine`` is the report's
work (the smallest epsilon at delta near the grid's best order): with
``refine.LAPLACE_ROWS = 1`` each curve is one numpy call (the old path, but for the
history collapsed once per refinement, which the new code also does), with the default
each block of 4,096 curves is one. CPU seconds (``time.process_time``), best of 3; the two
answers must agree to 1e-12.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from accounting import events as ev  # noqa: E402
from accounting import refine  # noqa: E402

DELTA = 1e-6


def ledger(n: int, seed: int = 0) -> ev.Event:
    rng = np.random.default_rng(seed)
    return ev.compose([ev.LaplaceEvent(float(x)) for x in rng.uniform(1e-4, 1e-2, n)] + [ev.GaussianEvent(50.0)])


def timed(event: ev.Event, rows: int) -> tuple[float, tuple[float, float]]:
    old, refine.LAPLACE_ROWS = refine.LAPLACE_ROWS, rows
    try:
        best, out = float("inf"), None
        for _ in range(3):
            t = time.process_time()
            out = refine.refine(event, DELTA, 64.0)
            best = min(best, time.process_time() - t)
        return best, out
    finally:
        refine.LAPLACE_ROWS = old


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,13500,50000")
    args = ap.parse_args()
    print(f"refine(event, delta {DELTA:g}, order 64): CPU seconds, best of 3")
    print(f"{'distinct':>9} {'one by one':>11} {'blocks':>8} {'ratio':>7}  epsilon (order)          same")
    for n in (int(s) for s in args.sizes.split(",")):
        event = ledger(n)
        slow, (e1, a1) = timed(event, 1)
        fast, (e2, a2) = timed(event, refine.LAPLACE_ROWS)
        same = abs(e1 - e2) <= 1e-12 * max(1.0, abs(e1)) and a1 == a2
        print(f"{n:>9,} {slow:>11.3f} {fast:>8.3f} {slow / fast:>6.1f}x  {e2:.10f} ({a2:g})  {same}")


if __name__ == "__main__":
    main()
