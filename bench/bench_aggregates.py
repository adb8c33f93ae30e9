#!/usr/bin/env python
"""DP aggregates benchmark: this engine against raw numpy/pyarrow and against diffprivlib
and OpenDP doing the same DP query, on one 10-million-row Parquet table, in one run.

    .venv/bin/python bench/bench_aggregates.py            # 10M rows (~4 min incl. generation)
    .venv/bin/python bench/bench_aggregates.py --quick    # 1M rows, fewer repeats (CI smoke)

The table (fixed seed, cached as var/bench/aggregates-<rows>-s<seed>.parquet) has
``income`` (float64, lognormal, declared bounds [0, 200000]; ~1% above the bound, so
clamping matters), ``region`` (string, 8 values) and ``age`` (int64, bounds [18, 90]).

For each query (epsilon 1.0, Laplace, one row per unit) it times, with
``time.perf_counter`` after warm-up, and prints medians:

* engine, read   ``engines.plugins.plan`` + ``pyarrow.parquet.read_table(columns=plan.columns)``
                 (what the worker's ``governance.datasets.data.load_columns`` does on a cache miss;
                 the file is in the OS page cache, nothing is dropped) + ``engines.plugins.run``;
* engine, mem    plan + run on the columns already in memory (the worker's LRU cache hit);
* raw, read/mem  the same exact (non-private) aggregate in numpy/pyarrow: the same read,
                 then ``num_rows`` / ``np.count_nonzero`` / ``np.clip`` + ``np.sum`` /
                 clipped sum over count / ``pc.value_counts``;
* diffprivlib    ``diffprivlib.tools`` (count_nonzero, sum, mean, histogram on codes from
                 ``pc.index_in``) on the in-memory columns (conversion to numpy timed);
* opendp         OpenDP doing the whole query on the in-memory columns: ``make_count >>
                 then_laplace``; ``make_clamp >> then_sum >> then_laplace``; mean = a
                 ``make_composition`` of that count and sum at epsilon/2 each (the engine's
                 algorithm); ``make_count_by_categories >> then_laplace`` on the strings.
                 Chains are built inside the timed call; their Laplace scales are found once
                 beforehand with ``dp.binary_search_param`` (map <= epsilon).

Library/engine speed-ups compare against "engine, mem" (both start from in-memory columns).
Engine and raw variants are interleaved (rotating order) in every repeat; the slower
library calls get fewer repeats and stop repeating after ``--lib-seconds`` per cell.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from importlib.metadata import version as _version
from pathlib import Path

from common import med

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
# --code DIR: import the engine from another tree (e.g. `git archive <commit> engines | tar -x -C DIR`)
CODE = Path(sys.argv[sys.argv.index("--code") + 1]).resolve() if "--code" in sys.argv[:-1] else REPO
sys.path.insert(0, str(CODE))

from engines import plugins  # noqa: E402
from engines.types import DatasetMeta, EngineRequest  # noqa: E402

REGIONS = ["central", "east", "north", "northeast", "northwest", "south", "southeast", "west"]
INCOME = (0.0, 200_000.0)
AGE = (18.0, 90.0)


# --------------------------------------------------------------------------- data


def data_file(rows: int, seed: int, directory: Path, regen: bool, log) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"aggregates-{rows}-s{seed}.parquet"
    if path.exists() and not regen:
        return path
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    income = np.round(rng.lognormal(mean=10.8, sigma=0.7, size=rows), 2)  # ~1% above 200,000
    region = pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, len(REGIONS), rows, dtype=np.int8)),
                                            pa.array(REGIONS)).cast(pa.string())
    age = rng.integers(18, 91, rows, dtype=np.int64)
    table = pa.table({"income": income, "region": region, "age": age})
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp)
    tmp.rename(path)
    log(f"generated {path} ({rows:,} rows, {path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f}s")
    return path


def meta(rows: int) -> DatasetMeta:
    return DatasetMeta(
        name="bench", unit_column=None, n_rows=rows, n_units=rows, delta=1e-9,
        columns={"income": {"type": "numeric", "lower": INCOME[0], "upper": INCOME[1], "integer": False},
                 "region": {"type": "categorical", "domain": list(REGIONS)},
                 "age": {"type": "numeric", "lower": AGE[0], "upper": AGE[1], "integer": True}})


# --------------------------------------------------------------------------- queries


def queries(eps: float) -> dict[str, dict]:
    return {
        "count": {"kind": "count", "params": {"epsilon": eps}},
        "count where age>=65": {"kind": "count", "params": {"epsilon": eps,
                                                            "where": [{"column": "age", "op": ">=", "value": 65}]}},
        "sum(income)": {"kind": "sum", "params": {"column": "income", "epsilon": eps}},
        "mean(income)": {"kind": "mean", "params": {"column": "income", "epsilon": eps}},
        "histogram(region)": {"kind": "histogram", "params": {"column": "region", "epsilon": eps}},
    }


def raw_compute(name: str, t: pa.Table):
    """The exact aggregate the engine computes before noise, written plainly."""
    if name == "count":
        return t.num_rows
    if name == "count where age>=65":
        return int(np.count_nonzero(t.column("age").to_numpy() >= 65))
    if name == "sum(income)":
        return float(np.sum(np.clip(t.column("income").to_numpy(), *INCOME)))
    if name == "mean(income)":
        x = t.column("income").to_numpy()
        return float(np.sum(np.clip(x, *INCOME))) / len(x)
    if name == "histogram(region)":
        return pc.value_counts(t.column("region"))
    raise KeyError(name)


RAW_COLUMNS = {"count": [], "count where age>=65": ["age"], "sum(income)": ["income"],
               "mean(income)": ["income"], "histogram(region)": ["region"]}


# --------------------------------------------------------------------------- libraries


def diffprivlib_calls(eps: float):
    try:
        import warnings

        warnings.filterwarnings("ignore", module="diffprivlib")
        import diffprivlib
        from diffprivlib import tools
        from diffprivlib.accountant import BudgetAccountant
    except Exception as e:  # noqa: BLE001 - not installed, or incompatible scikit-learn
        return None, f"unavailable ({type(e).__name__}: {str(e)[:80]})"

    def acc():
        return BudgetAccountant()  # a fresh one: the default accountant keeps every spend

    def count(t):
        return tools.count_nonzero(np.ones(t.num_rows, dtype=bool), epsilon=eps, accountant=acc())

    def count_where(t):
        return tools.count_nonzero(t.column("age").to_numpy() >= 65, epsilon=eps, accountant=acc())

    def dsum(t):
        return tools.sum(t.column("income").to_numpy(), epsilon=eps, bounds=INCOME, accountant=acc())

    def dmean(t):
        return tools.mean(t.column("income").to_numpy(), epsilon=eps, bounds=INCOME, accountant=acc())

    def dhist(t):
        codes = pc.index_in(t.column("region"), value_set=pa.array(REGIONS)).to_numpy(zero_copy_only=False)
        return tools.histogram(codes, epsilon=eps, bins=len(REGIONS), range=(0, len(REGIONS)), accountant=acc())[0]

    return ({"count": count, "count where age>=65": count_where, "sum(income)": dsum, "mean(income)": dmean,
             "histogram(region)": dhist}, f"diffprivlib {diffprivlib.__version__}")


def opendp_calls(eps: float):
    import opendp.prelude as dp

    dp.enable_features("contrib")
    fdom = dp.vector_domain(dp.atom_domain(T=float, nan=False))
    sdom = dp.vector_domain(dp.atom_domain(T=str))
    sym = dp.symmetric_distance()

    def count_chain(scale):
        return dp.t.make_count(fdom, sym, TO="i64") >> dp.m.then_laplace(scale)

    def sum_chain(scale):
        return dp.t.make_clamp(fdom, sym, bounds=INCOME) >> dp.t.then_sum() >> dp.m.then_laplace(scale)

    def hist_chain(scale):
        return dp.t.make_count_by_categories(sdom, sym, categories=list(REGIONS), TOA="i64") >> dp.m.then_laplace(scale)

    sc = {}
    for key, make, target in (("count", count_chain, eps), ("count/2", count_chain, eps / 2),
                              ("sum", sum_chain, eps), ("sum/2", sum_chain, eps / 2), ("hist", hist_chain, eps)):
        sc[key] = dp.binary_search_param(make, d_in=1, d_out=target, T=float)

    def check(m, target):
        if not m.map(1) <= target:  # pragma: no cover
            raise AssertionError("OpenDP chain over budget")
        return m

    def count(t):  # a column is needed as the vector: income (no nulls, no NaN)
        return check(count_chain(sc["count"]), eps)(t.column("income").to_numpy())

    def count_where(t):  # OpenDP has no row filter on plain vectors: numpy filters, OpenDP counts
        age = t.column("age").to_numpy()
        return check(count_chain(sc["count"]), eps)(age[age >= 65].astype(np.float64))

    def osum(t):
        return check(sum_chain(sc["sum"]), eps)(t.column("income").to_numpy())

    def omean(t):
        m = check(dp.c.make_composition([count_chain(sc["count/2"]), sum_chain(sc["sum/2"])]), eps * (1 + 1e-12))
        c, s = m(t.column("income").to_numpy())
        return s / max(c, 1)

    def ohist(t):
        return check(hist_chain(sc["hist"]), eps)(t.column("region").to_numpy(zero_copy_only=False))

    return ({"count": count, "count where age>=65": count_where, "sum(income)": osum, "mean(income)": omean,
             "histogram(region)": ohist}, f"opendp {_version('opendp')}")


# --------------------------------------------------------------------------- timing


def fmt_ms(s):
    if s != s:
        return "-"
    ms = s * 1e3
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 1 else f"{ms:.3f}"


def ratio(a, b):
    return "-" if a != a or b != b or b == 0 else f"{a / b:.2f}x"


def git_code() -> str:
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "engines", "governance"],
                               capture_output=True, text=True).stdout.strip()
        return head + (" + uncommitted changes in engines/ or governance/" if dirty else "")
    except OSError:
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--seed", type=int, default=20261121)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=9, help="timed repeats of engine/raw variants (9)")
    ap.add_argument("--lib-repeats", type=int, default=3, help="timed repeats of library calls (3)")
    ap.add_argument("--lib-seconds", type=float, default=45.0,
                    help="stop repeating a library cell after this many seconds (>= 1 timed repeat)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--data-dir", type=Path, default=REPO / "var" / "bench")
    ap.add_argument("--regen", action="store_true", help="regenerate the cached table")
    ap.add_argument("--quick", action="store_true", help="1M rows, 5/2 repeats (CI smoke)")
    ap.add_argument("--no-libs", action="store_true", help="skip diffprivlib and OpenDP")
    ap.add_argument("--only", default="", help="comma-separated query names (default: all)")
    ap.add_argument("--code", type=Path, default=REPO, help="import engines/ from this directory (before/after runs)")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.repeats, args.lib_repeats, args.lib_seconds = 1_000_000, 5, 2, 10.0
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731
    t_start = time.monotonic()
    load0 = os.getloadavg()

    path = data_file(args.rows, args.seed, args.data_dir, args.regen, log)
    dataset = meta(pq.ParquetFile(path).metadata.num_rows)
    qs = queries(args.epsilon)
    if args.only:
        qs = {k: v for k, v in qs.items() if k in args.only.split(",")}
    perf = time.perf_counter
    noop = lambda update: None  # noqa: E731 - the worker's progress callback writes a row; not timed here

    def engine(name, table=None, phases=None):
        q = qs[name]
        req = EngineRequest(kind=q["kind"], params=q["params"])
        t0 = perf()
        plan = plugins.plan("aggregates", req, dataset)
        t1 = perf()
        data = table if table is not None else pq.read_table(path, columns=list(plan.columns))
        t2 = perf()
        marks = []
        progress = (lambda u: marks.append((u["phase"], perf()))) if phases is not None else noop
        rel = plugins.run("aggregates", req, dataset, data, plan, progress)
        t3 = perf()
        if phases is not None:
            phases.setdefault("plan", []).append(t1 - t0)
            prev, prev_phase = t2, "start"
            for phase, at in marks:  # a segment is named by the progress phase that opened it
                phases.setdefault(prev_phase, []).append(at - prev)
                prev, prev_phase = at, phase
            phases.setdefault("return", []).append(t3 - prev)
        return rel, plan

    mem = {name: pq.read_table(path, columns=list(engine(name)[1].columns)) for name in qs}
    for name in qs:  # the engine's columns are the raw computation's columns
        assert mem[name].column_names == RAW_COLUMNS[name], (name, mem[name].column_names)

    variants = {
        "engine_read": lambda name: engine(name),
        "engine_mem": lambda name: engine(name, mem[name]),
        "raw_read": lambda name: raw_compute(name, pq.read_table(path, columns=RAW_COLUMNS[name])),
        "raw_mem": lambda name: raw_compute(name, mem[name]),
    }
    times = {name: {v: [] for v in variants} for name in qs}
    phases = {name: {} for name in qs}
    for name in qs:
        order = list(variants)
        for r in range(args.warmup + args.repeats):
            for v in order[r % 4:] + order[:r % 4]:
                t0 = perf()
                variants[v](name)
                dt = perf() - t0
                if r >= args.warmup:
                    times[name][v].append(dt)
        for _ in range(args.repeats):  # phase split of the in-memory path, separately
            engine(name, mem[name], phases[name])
        log(f"{name}: engine mem {fmt_ms(med(times[name]['engine_mem']))} ms, raw mem "
            f"{fmt_ms(med(times[name]['raw_mem']))} ms")

    libs = {}
    lib_desc = {}
    # Libraries need a vector even to count all rows: give them income (in memory, untimed).
    lib_input = {name: mem[name] if mem[name].num_columns else pq.read_table(path, columns=["income"])
                 for name in qs}
    if not args.no_libs:
        for lib, make in (("diffprivlib", diffprivlib_calls), ("opendp", opendp_calls)):
            calls, desc = make(args.epsilon)
            lib_desc[lib] = desc
            if calls is None:
                continue
            libs[lib] = {}
            for name in qs:
                samples = []
                t_cell = perf()
                for r in range(args.warmup + args.lib_repeats):
                    t0 = perf()
                    calls[name](lib_input[name])
                    dt = perf() - t0
                    if r >= args.warmup:
                        samples.append(dt)
                    if samples and perf() - t_cell > args.lib_seconds:
                        break
                libs[lib][name] = samples
                log(f"{name}: {lib} {fmt_ms(med(samples))} ms (n={len(samples)})")

    load1 = os.getloadavg()
    # ---------------------------------------------------------------- report
    print(f"== DP aggregates: {dataset.n_rows:,} rows, {path} ({path.stat().st_size / 1e6:.0f} MB, "
          f"{pq.ParquetFile(path).metadata.num_row_groups} row groups)")
    code = git_code() if CODE == REPO else f"{CODE} (--code)"
    print(f"   code at git {code}; Python {platform.python_version()}, numpy {np.__version__}, "
          f"pyarrow {pa.__version__}, opendp {_version('opendp')}"
          + "".join(f", {d}" for k, d in lib_desc.items() if k != "opendp"))
    print(f"   {os.cpu_count()} CPUs; 1-min load avg start/end {load0[0]:.2f}/{load1[0]:.2f}; epsilon {args.epsilon}; "
          f"medians of {args.repeats} (engine/raw, interleaved) and <= {args.lib_repeats} (libraries) after "
          f"{args.warmup} warm-up; run {time.monotonic() - t_start:.0f}s")
    print()
    hdr = (f"{'query':<21}{'engine ms':>10}{'raw ms':>9}{'eng/raw':>8} | {'engine ms':>9}{'raw ms':>9}"
           f"{'eng/raw':>8} | {'diffprivlib':>11}{'opendp':>9}{'dpl/eng':>8}{'odp/eng':>8}")
    print(f"{'':<21}{'-- read from Parquet + compute --':^27} | {'-- columns in memory --':^26} | "
          f"{'-- libraries (in memory), ms --':^36}")
    print(hdr)
    print("-" * len(hdr))
    for name in qs:
        t = {v: med(x) for v, x in times[name].items()}
        d = med(libs.get("diffprivlib", {}).get(name, []))
        o = med(libs.get("opendp", {}).get(name, []))
        print(f"{name:<21}{fmt_ms(t['engine_read']):>10}{fmt_ms(t['raw_read']):>9}"
              f"{ratio(t['engine_read'], t['raw_read']):>8} | {fmt_ms(t['engine_mem']):>9}{fmt_ms(t['raw_mem']):>9}"
              f"{ratio(t['engine_mem'], t['raw_mem']):>8} | {fmt_ms(d):>11}{fmt_ms(o):>9}"
              f"{ratio(d, t['engine_mem']):>8}{ratio(o, t['engine_mem']):>8}")
    print()
    print("engine phases, columns in memory (median ms; each from its progress() call to the next; "
          "'filtering' = predicates, value column, clamp, group codes):")
    for name in qs:
        parts = ", ".join(f"{k} {fmt_ms(med(v))}" for k, v in phases[name].items())
        print(f"  {name}: {parts}")
    if libs:
        ns = {lib: sorted({len(v) for v in cells.values()}) for lib, cells in libs.items()}
        print("library repeats per cell: " + "; ".join(f"{lib} {'/'.join(map(str, n))}" for lib, n in ns.items()))
    for lib, desc in lib_desc.items():
        if lib not in libs:
            print(f"{lib}: {desc}")


if __name__ == "__main__":
    main()
