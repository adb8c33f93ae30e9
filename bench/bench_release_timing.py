#!/usr/bin/env python
"""Release-path timing: how long one noise draw takes, and what ticks hide of it.

The service's samplers (OpenDP's, through ``engines.aggregates.noise``) take a time that
depends on the noise they draw (rejection sampling). A run's outcome is shown on the next
tick of its clock (``RELEASE_QUANTUM_MS``, docs/privacy.md "Privacy promise and release-path
side channels"), so the time of a draw moves the tick only when a tick falls inside the draw:
for a draw of t seconds, with ticks Q apart, a chance of about t / Q.

For each mechanism (discrete and float Laplace and Gaussian, at three noise scales) the
benchmark times ``--draws`` releases of one value, next to ``numpy``'s floating-point
sampler for the same distribution (constant-time, but attackable: Mironov 2012; never
used for releases here), and prints the median, 99th percentile and maximum draw times,
the ratio of OpenDP's to numpy's median, and the implied chance per release that a tick
falls inside a draw (mean draw time / Q) for Q = 1,000, 250 and 100 ms.

    .venv/bin/python bench/bench_release_timing.py [--draws 5000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from engines.aggregates.noise import Noise  # noqa: E402

QUANTA_MS = (1000, 250, 100)


def timings(fn, draws: int) -> list[float]:
    out = []
    for _ in range(draws):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    out.sort()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draws", type=int, default=5000, help="draws per mechanism and scale")
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    print(f"== release timing: {args.draws:,} draws each; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs at the start")
    head = f"{'sampler':<26}{'scale':>9}{'median us':>11}{'p99 us':>9}{'max us':>10}{'vs numpy':>10}"
    head += "".join(f"{'P(tick) Q=' + str(q):>17}" for q in QUANTA_MS)
    print(head)
    worst = 0.0
    for mech in ("laplace", "gaussian"):
        for integer in (True, False):
            for scale in (1.0, 1e3, 1e6):
                m = Noise(mech, scale, 1.0, integer, False).measurement()
                x = 1000 if integer else 1000.0
                m(x)  # warm-up
                ts = timings(lambda: m(x), args.draws)
                draw = (lambda: rng.laplace(x, scale)) if mech == "laplace" else (lambda: rng.normal(x, scale))
                base = timings(draw, args.draws)
                med, p99, top = ts[len(ts) // 2], ts[int(0.99 * len(ts)) - 1], ts[-1]
                mean = statistics.fmean(ts)
                worst = max(worst, mean)
                row = (f"{'opendp ' + mech + (' discrete' if integer else ' float'):<26}{scale:>9.0e}"
                       f"{med * 1e6:>11.1f}{p99 * 1e6:>9.1f}{top * 1e6:>10.1f}{med / base[len(base) // 2]:>9.1f}x")
                row += "".join(f"{mean / (q / 1000):>17.1e}" for q in QUANTA_MS)
                print(row)
    print(f"largest mean draw {worst * 1e6:.1f} us: with the default RELEASE_QUANTUM_MS=1000 a tick falls inside "
          f"a draw at most {worst:.1e} of the time (one draw per release; a grouped release draws once per group)")


if __name__ == "__main__":
    main()
