#!/usr/bin/env python3
"""What one POST /api/compose/ costs in CPU, old path against new, side by side (issue 22).

    .venv/bin/python bench/bench_compose.py [--quick]

For 20, 200 and 2,000 subsampled-Gaussian events, distinct (every event its own (q, z),
drawn like DP-SGD runs: q 1e-4 .. 0.02, z 0.8 .. 2, 100 .. 10,000 steps) and repeated
(the same 5 runs over and over), the three accountants' ``compose`` as the endpoint runs
it:

- old: the code before bounded work: no budget, no per-order cache (the (q, z) grid
  curve cache was already there); every call starts with empty caches;
- new, cold: a budget of ``accounting.work.MAX_UNITS`` opened and the grid curves priced
  before any is computed; a call past the budget is refused (the time is then what the
  refusal took, marked ``refused``); empty caches;
- new, warm: the same call again in the same process (the per-(q, z, order) cache);
- dp_accounting: its ``RdpAccountant`` (default orders) composing the same events,
  ``get_epsilon`` at the same delta.

CPU seconds of this process (``time.process_time``), one run each, on the shared 2-core
machine. ``--quick`` skips the old path's 2,000 distinct events (minutes) and prints the
200's time x 10 instead, marked ``~``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from accounting import ACCOUNTANTS, rdp_math, work  # noqa: E402
from accounting.events import SubsampledGaussianEvent  # noqa: E402

DELTA = 1e-5


def events(n: int, distinct: bool, seed: int = 0) -> list[SubsampledGaussianEvent]:
    rng = random.Random(seed)

    def one():
        return SubsampledGaussianEvent(10 ** rng.uniform(-4, -1.7), rng.uniform(0.8, 2.0), rng.randint(100, 10_000))
    if distinct:
        return [one() for _ in range(n)]
    runs = [one() for _ in range(5)]
    return [runs[i % 5] for i in range(n)]


def cold():
    rdp_math._one_step_curve.cache_clear()
    rdp_math._SERIES.clear()
    work._COUNTS.clear()


def compose_all(evs):
    return {name: acc.compose(evs, DELTA) for name, acc in ACCOUNTANTS.items()}


def old(evs) -> tuple[float, str]:
    cold()
    saved = rdp_math._SERIES
    rdp_math._SERIES = rdp_math._LRU(0)  # no per-order cache: the old subsampled_at
    try:
        t = time.process_time()
        compose_all(evs)
        return time.process_time() - t, ""
    finally:
        rdp_math._SERIES = saved


def new(evs) -> tuple[float, str]:
    t = time.process_time()
    try:
        with work.limit() as meter:
            work.charge_grid(evs)
            compose_all(evs)
        note = f"{meter.used:,} units"
    except work.TooCostly as e:
        note = f"refused ({e.needed:,} > {e.limit:,} units)"
    return time.process_time() - t, note


def dp_accounting_time(evs) -> float:
    import dp_accounting
    from dp_accounting import rdp

    t = time.process_time()
    acc = rdp.RdpAccountant()
    for e in evs:
        acc.compose(dp_accounting.PoissonSampledDpEvent(
            e.sample_rate, dp_accounting.GaussianDpEvent(e.noise_multiplier)), e.steps)
    acc.get_epsilon(DELTA)
    return time.process_time() - t


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    print(f"POST /api/compose/ CPU seconds, subsampled_gaussian events, delta {DELTA:g}; "
          f"budget {work.MAX_UNITS:,} work units")
    print(f"{'events':>7} {'kind':>9} {'old':>9} {'new cold':>9} {'new warm':>9} {'dp_acc.':>9}  new")
    old_200 = None
    for n in (20, 200, 2000):
        for distinct in (True, False):
            evs = events(n, distinct)
            if args.quick and n == 2000 and distinct and old_200 is not None:
                o, mark = old_200 * 10, "~"
            else:
                o, mark = old(evs)[0], ""
            if n == 200 and distinct:
                old_200 = o
            cold()
            c, note = new(evs)
            w, _ = new(evs)
            d = dp_accounting_time(evs)
            print(f"{n:>7} {'distinct' if distinct else 'repeated':>9} {mark + format(o, '.3f'):>9} "
                  f"{c:>9.3f} {w:>9.3f} {d:>9.3f}  {note}", flush=True)


if __name__ == "__main__":
    main()
