#!/usr/bin/env python3
"""Accounting tightness, measured side by side in one run (issue 16).

    .venv/bin/python bench/bench_accounting.py [--quick]

1. Plain RDP composition of DP-SGD runs: the ledger's 56-order grid, ``compose`` (the
   order refined off the grid, accounting/refine.py) and dp_accounting's RdpAccountant
   on a dense grid (fractional orders 1.01..64 by 0.05, every integer 64..511, every
   16th 512..4096), with the
   optimistic PLD as the certified lower bound; ratios to the dense grid.
2. Steps a DP-SGD run gets at the same target epsilon: the largest T with epsilon <=
   target at fixed (q, z), certified by RDP on the ledger's grid (the planner's default)
   and by PLD (engines/dpsgd/pld.py, pessimistic, an upper bound).
3. The planner's noise calibration to a target epsilon (fixed q, steps): the noise
   multiplier and the time it takes under RDP (calibrate.noise_multiplier) and under PLD
   (pld.noise_multiplier); caches cleared before each.
4. The ledger's reported RDP epsilon, three ways over the issue's DP-SGD grid (q 1e-4 ..
   0.1, z 0.5 .. 5, 10 .. 100,000 steps): the stored 56-order grid, the grid curve with
   (alpha - 1) eps(alpha) interpolated linearly between orders (valid by convexity; no
   events needed) and the order refined off the grid from the events (what the reports
   show); how many are within 0.5% of the refined value.
5. What a refined report costs: a ledger of N releases (aggregates and some DP-SGD runs),
   composed from its events (parse, collapse, refine) beside the grid report from the
   cost vector alone.
6. MST synthesis calibrated to a target epsilon under RDP (the ledger's accountant) and
   under PLD (engines/synthesis/planner.py): the noise on the one-way and two-way
   marginals and the plan's wall time.

Pure computation, no services; timings are wall time on the shared 2-core machine (other
engineers' jobs run beside it), so read them as rough.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from dp_accounting import dp_event  # noqa: E402
from dp_accounting.pld import privacy_loss_distribution as pld_lib  # noqa: E402
from dp_accounting.rdp import RdpAccountant  # noqa: E402

from accounting import parse_event, rdp  # noqa: E402
from accounting.costs import price  # noqa: E402
from engines.dpsgd import calibrate, pld  # noqa: E402

DENSE = list(np.round(np.arange(1.01, 64, 0.05), 4)) + list(range(64, 512)) + list(range(512, 4097, 16))


def dense_rdp(q, z, steps, delta, orders):
    acc = RdpAccountant(orders)
    acc.compose(dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), steps))
    return acc.get_epsilon(delta)


def pld_lower(q, z, steps, delta):
    one = pld_lib.from_gaussian_mechanism(z, sampling_prob=q, pessimistic_estimate=False,
                                          value_discretization_interval=2e-5, use_connect_dots=False)
    return one.self_compose(steps).get_epsilon_for_delta(delta)


def table_compose(cases, delta):
    print(f"\n1. Plain composition at delta {delta:g} (epsilon; ratio to dp_accounting dense grid)")
    print(f"{'q':>7} {'z':>5} {'steps':>7} | {'grid56':>8} {'ratio':>7} | {'compose':>8} {'ratio':>7} {'ms':>6} | "
          f"{'dense':>8} {'ms':>7} | {'PLD low':>8}")
    worst = 0.0
    for q, z, steps in cases:
        event = parse_event({"kind": "subsampled_gaussian", "sample_rate": q, "noise_multiplier": z, "steps": steps})
        grid = rdp.spent(price(event, delta).cost, delta).epsilon
        t = time.perf_counter()
        got = rdp.compose([event], delta).epsilon
        t_ref = time.perf_counter() - t
        t = time.perf_counter()
        dense = dense_rdp(q, z, steps, delta, DENSE)
        t_dense = time.perf_counter() - t
        low = pld_lower(q, z, steps, delta)
        worst = max(worst, got / dense - 1)
        print(f"{q:>7g} {z:>5g} {steps:>7} | {grid:8.4f} {grid / dense:7.4f} | {got:8.4f} {got / dense:7.4f} "
              f"{t_ref * 1e3:6.0f} | {dense:8.4f} {t_dense * 1e3:7.0f} | {low:8.4f}", flush=True)
    print(f"worst compose / dense: {1 + worst:.5f}")


def table_steps(cases, delta):
    print(f"\n2. Steps at the same target epsilon, delta {delta:g} (RDP: ledger grid; PLD: pessimistic, "
          f"{pld.INTERVAL:g} buckets)")
    print(f"{'q':>7} {'z':>5} {'target':>6} | {'RDP steps':>9} {'PLD steps':>9} {'PLD/RDP':>8} | {'PLD s':>6}")
    ratios = []
    for q, z, target in cases:
        rdp_steps = pld.max_steps(target, delta, q, z, lambda q_, z_, t_, d_: calibrate.epsilon(q_, z_, t_, 0.0, 0, d_))
        t = time.perf_counter()
        pld_steps = pld.max_steps(target, delta, q, z, lambda q_, z_, t_, d_: pld.epsilon(q_, z_, t_, 0.0, 0, d_))
        dt = time.perf_counter() - t
        ratio = pld_steps / rdp_steps if rdp_steps else float("inf")
        ratios.append(ratio)
        print(f"{q:>7g} {z:>5g} {target:>6g} | {rdp_steps:>9} {pld_steps:>9} {ratio:8.3f} | {dt:6.1f}", flush=True)
    print(f"PLD/RDP steps: min {min(ratios):.3f}, median {float(np.median(ratios)):.3f}")


def table_calibration(cases, delta):
    print(f"\n3. Noise calibration to a target, delta {delta:g} (z; wall time, caches cleared)")
    print(f"{'q':>7} {'steps':>6} {'target':>6} | {'RDP z':>7} {'s':>5} | {'PLD z':>7} {'s':>5} | {'z PLD/RDP':>9}")
    from accounting import rdp_math

    for q, steps, target in cases:
        rdp_math._one_step_curve.cache_clear()
        pld.epsilon.cache_clear()
        t = time.perf_counter()
        z_rdp = calibrate.noise_multiplier(target, delta, q, steps)
        t_rdp = time.perf_counter() - t
        t = time.perf_counter()
        z_pld = pld.noise_multiplier(target, delta, q, steps)
        t_pld = time.perf_counter() - t
        print(f"{q:>7g} {steps:>6} {target:>6g} | {z_rdp:7.4f} {t_rdp:5.2f} | {z_pld:7.4f} {t_pld:5.2f} | "
              f"{z_pld / z_rdp:9.4f}", flush=True)


def interpolated(curve, delta, points=64):
    """The grid curve's conversion with (alpha - 1) eps(alpha) linear between grid orders."""
    from accounting.rdp_math import FINITE_ORDERS

    a_grid = np.array(FINITE_ORDERS)
    line = (a_grid - 1) * curve[:-1]
    t = np.linspace(0.0, 1.0, points)
    a = a_grid[:-1, None] + (a_grid[1:] - a_grid[:-1])[:, None] * t
    with np.errstate(all="ignore"):
        l_a = line[:-1, None] + (line[1:] - line[:-1])[:, None] * t
        eps = l_a / (a - 1) + np.log1p(-1 / a) - (np.log(delta) + np.log(a)) / (a - 1)
    return float(np.nanmin(np.where(np.isnan(eps), np.inf, eps)))


def table_reported(delta):
    print(f"\n4. The ledger's reported rdp epsilon at delta {delta:g}: grid, interpolated grid, refined (from "
          "the events); issue grid of 48 DP-SGD runs")
    print(f"{'q':>7} {'z':>5} {'steps':>7} | {'grid56':>9} {'interp':>9} {'refined':>9} | {'grid/ref':>8} "
          f"{'interp/ref':>10}")
    within = {"grid": 0, "interp": 0}
    gains = []
    n = 0
    for q in (1e-4, 1e-3, 0.01, 0.1):
        for z in (0.5, 1.1, 2.0, 5.0):
            for steps in (10, 1000, 100_000):
                event = parse_event({"kind": "subsampled_gaussian", "sample_rate": q, "noise_multiplier": z,
                                     "steps": steps})
                cost = price(event, delta).cost
                grid = rdp.spent(cost, delta).epsilon
                inter = min(grid, interpolated(cost.rdp, delta))
                ref = rdp.refined(rdp.spent(cost, delta), event, delta).epsilon
                within["grid"] += grid <= ref * 1.005
                within["interp"] += inter <= ref * 1.005
                gains.append(1 - inter / grid)
                n += 1
                print(f"{q:>7g} {z:>5g} {steps:>7} | {grid:9.5g} {inter:9.5g} {ref:9.5g} | {grid / ref:8.4f} "
                      f"{inter / ref:10.4f}", flush=True)
    print(f"within 0.5% of refined: grid {within['grid']}/{n}, interpolated {within['interp']}/{n}; "
          f"interpolation's largest gain over the grid: {max(gains):.2e}")


def _ledger(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        r = rng.random()
        if r < 0.45:
            out.append({"kind": "laplace", "epsilon": float(rng.choice([0.01, 0.02, 0.05, 0.1]))})
        elif r < 0.9:
            out.append({"kind": "gaussian", "noise_multiplier": float(rng.uniform(5, 50)), "delta": 1e-9})
        elif r < 0.98:
            out.append({"kind": "epsilon_delta", "epsilon": float(rng.choice([0.01, 0.05])), "delta": 0.0})
        else:  # DP-SGD runs: a few distinct (q, z) settings, many step counts
            out.append({"kind": "subsampled_gaussian", "sample_rate": float(rng.choice([0.004, 0.01])),
                        "noise_multiplier": float(rng.choice([1.1, 2.0])), "steps": int(rng.integers(100, 3000)),
                        "delta": 1e-9})
    return out


def table_report_cost(delta, sizes):
    from accounting import events as ev
    from accounting import rdp_math
    from accounting.costs import Cost, cost_of

    print(f"\n5. A refined report of a whole ledger (delta {delta:g}; pure computation, the database read not "
          "included): ms")
    print(f"{'entries':>8} | {'grid (cost vector)':>18} | {'parse':>7} {'refine':>7} {'total':>7} | {'grid eps':>9} "
          f"{'refined':>9} {'ratio':>6}")
    for n in sizes:
        raw = _ledger(n)
        state = Cost.zero()
        for e in raw:
            state = state + cost_of(parse_event(e))
        t = time.perf_counter()
        grid = rdp.spent(state, delta)
        t_grid = time.perf_counter() - t
        t = time.perf_counter()
        event = ev.compose([parse_event(e) for e in raw])
        t_parse = time.perf_counter() - t
        rdp_math._one_step_curve.cache_clear()
        t = time.perf_counter()
        ref = rdp.refined(grid, event, delta)
        t_ref = time.perf_counter() - t
        total = (t_parse + t_ref) * 1e3
        print(f"{n:>8} | {t_grid * 1e3:18.2f} | {t_parse * 1e3:7.1f} {t_ref * 1e3:7.1f} {total:7.1f} | "
              f"{grid.epsilon:9.5g} {ref.epsilon:9.5g} {ref.epsilon / grid.epsilon:6.4f}", flush=True)


def table_mst(cases, delta):
    from engines.synthesis.planner import make_plan
    from engines.types import DatasetMeta, EngineRequest

    print(f"\n6. MST synthesis calibrated to a target under RDP and PLD (delta {delta:g}; one row per unit; "
          "discrete Gaussian scales)")
    print(f"{'cols':>4} {'target':>6} | {'RDP one-way':>11} {'two-way':>8} {'s':>5} | {'PLD one-way':>11} "
          f"{'two-way':>8} {'s':>5} | {'PLD/RDP':>7} | {'PLD cert':>8} {'RDP charge':>10}")
    for d, target in cases:
        cols = {f"c{i}": ({"type": "categorical", "domain": list("abcdef")} if i % 2 else
                          {"type": "numeric", "lower": 0, "upper": 100}) for i in range(d)}
        meta = DatasetMeta("b", cols, None, 100_000, 100_000, delta, allow_pld=True)
        out = {}
        for acc in ("rdp", "pld"):
            t = time.perf_counter()
            plan = make_plan(EngineRequest("synthesize", {"epsilon": target, "accountant": acc}), meta)
            out[acc] = (plan.details["mst"]["one_way"]["scale"], plan.details["mst"]["two_way"]["scale"],
                        time.perf_counter() - t, plan.details)
        r, p = out["rdp"], out["pld"]
        print(f"{d:>4} {target:>6g} | {r[0]:11.3f} {r[1]:8.3f} {r[2]:5.2f} | {p[0]:11.3f} {p[1]:8.3f} {p[2]:5.2f} | "
              f"{p[0] / r[0]:7.4f} | {p[3]['certified_epsilon']:8.4f} {p[3]['planned_epsilon']:10.4f}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer cases (about a minute)")
    args = ap.parse_args(argv)
    print("bench_accounting: pure computation on a shared 2-core machine; timings are rough")
    compose_cases = [(0.001, 1.5, 1000), (0.01, 1.1, 3000), (1e-4, 0.8, 100_000), (0.1, 5.0, 10), (0.05, 0.7, 500),
                     (0.004, 1.1, 3000), (0.02, 2.0, 20_000), (1e-3, 3.0, 100)]
    steps_cases = [(0.01, 1.0, 1.0), (0.01, 1.0, 3.0), (0.004, 1.1, 1.0), (0.004, 1.1, 8.0), (0.05, 2.0, 2.0),
                   (0.001, 0.8, 1.0)]
    calibration_cases = [(0.01, 1000, 1.0), (0.004, 3000, 1.0), (0.02, 100, 2.0), (0.05, 2000, 8.0)]
    if args.quick:
        compose_cases, steps_cases, calibration_cases = compose_cases[:4], steps_cases[:3], calibration_cases[:2]
    mst_cases = [(4, 0.5), (4, 1.0), (8, 1.0), (8, 3.0), (12, 1.0)]
    report_sizes = [100, 1000, 10_000, 100_000]
    if args.quick:
        mst_cases, report_sizes = mst_cases[:2], report_sizes[:3]
    table_compose(compose_cases, 1e-5)
    table_steps(steps_cases, 1e-5)
    table_calibration(calibration_cases, 1e-5)
    table_reported(1e-5)
    table_report_cost(1e-6, report_sizes)
    table_mst(mst_cases, 1e-6)


if __name__ == "__main__":
    main()
