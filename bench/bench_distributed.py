"""The aggregates engine on Dask next to the local engine, on Parquet partitions made by
bench/gen_partitions.py: time per row on 1 and 2 local Dask workers (processes, one
thread each) and on the local engine (one process reads the whole table, then runs), and
whether the exact aggregates (before noise) are identical. Measured side by side in one
run; on a shared 2-core machine, so the absolute times move with the other users' load.

    .venv/bin/python bench/gen_partitions.py --rows 10_000_000 --partitions 8 --out var/bench/parts-10M
    .venv/bin/python bench/bench_distributed.py --data var/bench/parts-10M --exact
    .venv/bin/python bench/bench_distributed.py --data var/bench/parts-100M
    .venv/bin/python bench/bench_distributed.py --data var/bench/parts-1B --no-local --queries count,grouped_mean
    .venv/bin/python bench/bench_distributed.py --plot var/bench/distributed-*.json
    .venv/bin/python bench/bench_distributed.py --dpsgd 400_000       # DP-SGD: 1 vs 2 ranks

--dpsgd ROWS: the DP-SGD engine on ROWS generated rows (8 Parquet partitions in a temporary
directory; 20 numeric features, a binary label from a fixed logistic model, no unit
column): the same plan (target epsilon 3, expected batch 1024, MLP 20-256-256-1) run as
one process (the Celery worker's path for ranks = 1: partitions read into one table,
torch on 1 thread, then on 2) and as 2 ranks on a LocalCluster of 2 worker processes
(1 thread each, gloo over loopback). Time per epoch = (T(3 epochs) - T(1 epoch)) / 2 of
whole runs (read, preparation, rendezvous and the files included in both, so they cancel),
medians of --repeat rounds, each running every variant once in rotating order.

Queries (row-level privacy unless named unit_*): count (where age >= 30), grouped_mean
(value in [0, 100] by region), sum, histogram (age, 9 bins), quantile (median of value);
with --exact (or --queries naming them) also the unit-level queries on the pid unit:
unit_count (k = 1, with the where: counted per unit id, engines/distributed/unit_counts.py),
unit_sum (k = 64, above the most rows of any unit, 18 at 10M rows: row-level with the rows
counted per unit id beside, engines.distributed.aggregates._within_bound; --no-hint: dealt
as the next two), unit_grouped_mean (k = 2) and unit_histogram (k = 2), which deal the
rows into unit buckets on the cluster (engines.distributed.cluster.by_unit: no shuffle,
nothing on disk) and keep each unit's k rows of smallest salted hash; the local engine
and Dask use the same salt, so their exact aggregates must be identical (unit_X is also
compared per row with the row-level X on Dask: "unit / row"). The engine gets what the
host passes it: the unit ids' range from the footers and the registered most rows of one
unit (computed here from the pid column, outside the timing). Each timing is the median of --repeat runs (reading the partitions
included; the local engine's read is timed apart too): on Dask the whole DP answer (the
exact parts on the cluster, then the OpenDP noise once and the result JSON, kept in the
JSON file as dp_answer); on the local engine the exact aggregate (its noise step is the
same code and takes microseconds).
Results go to stdout and, as JSON, to --json (default var/bench/distributed-<rows>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from engines import plugins  # noqa: E402
from engines.aggregates import execute as local  # noqa: E402
from engines.distributed import PartitionedTable  # noqa: E402
from engines.distributed import aggregates as dist  # noqa: E402
from engines.distributed import cluster as dcluster  # noqa: E402
from engines.distributed import source  # noqa: E402
from engines.types import DatasetMeta, EngineRequest  # noqa: E402

REGIONS = ["north", "south", "east", "west", "centre", "islands", "abroad", "unknown"]
COLUMNS = {"pid": {"type": "unit"}, "value": {"type": "numeric", "lower": 0, "upper": 100},
           "age": {"type": "numeric", "lower": 18, "upper": 90}, "region": {"type": "categorical", "domain": REGIONS}}
QUERIES = {
    "count": ("count", {"where": [{"column": "age", "op": ">=", "value": 30}]}),
    "grouped_mean": ("mean", {"column": "value", "group_by": "region"}),
    "sum": ("sum", {"column": "value"}),
    "histogram": ("histogram", {"column": "age", "bins": [18, 26, 34, 42, 50, 58, 66, 74, 82, 90]}),
    "quantile": ("quantile", {"column": "value", "q": 0.5}),
}
UNIT_QUERIES = {
    "unit_count": ("count", {"where": [{"column": "age", "op": ">=", "value": 30}], "max_rows_per_unit": 1}),
    "unit_sum": ("sum", {"column": "value", "max_rows_per_unit": 64}),
    "unit_grouped_mean": ("mean", {"column": "value", "group_by": "region", "max_rows_per_unit": 2}),
    "unit_histogram": ("histogram", {"column": "age", "bins": [18, 26, 34, 42, 50, 58, 66, 74, 82, 90],
                                     "max_rows_per_unit": 2}),
}
ROW_TWIN = {"unit_count": "count", "unit_sum": "sum", "unit_grouped_mean": "grouped_mean",
            "unit_histogram": "histogram"}
SALT = 20261125  # the bounding salt of every unit-level run here (local and Dask alike)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def meta(rows: int, unit: bool) -> DatasetMeta:
    cols = COLUMNS if unit else {k: v for k, v in COLUMNS.items() if k != "pid"}
    return DatasetMeta(name="bench", columns=cols, unit_column="pid" if unit else None, n_rows=rows,
                       n_units=rows // 4 if unit else rows, delta=1e-9)


def _cpu_seconds() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _cpu(scheduler: str = "") -> float:
    """CPU seconds used so far by this process and, on a cluster, by its workers: the work
    a run does, which the other users' load moves far less than its wall time."""
    workers = dcluster.client(scheduler).run(_cpu_seconds).values() if scheduler else ()
    return _cpu_seconds() + sum(workers)


def timed(fn, repeat: int, scheduler: str = ""):
    """Median wall seconds and median CPU seconds (this process and the workers) of
    ``repeat`` runs, and the last run's output."""
    times, cpus, out = [], [], None
    for _ in range(repeat):
        c0, t0 = _cpu(scheduler), time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
        cpus.append(_cpu(scheduler) - c0)
    return (statistics.median(times), statistics.median(cpus)), out


def run_local(paths, plan, n, repeat):
    cols = list(dict.fromkeys(plan.columns + (["pid"] if plan.details["unit_column"] else [])))

    def read():
        return pq.read_table(paths, columns=cols) if len(paths) > 1 else pq.read_table(paths[0], columns=cols)

    def once():
        table = read()
        return local.exact_parts(plan.details, table, n, np.random.default_rng(), salt=SALT)

    (t_read, _), _ = timed(read, 1)
    (t, cpu), parts = timed(once, repeat)
    return t, cpu, t_read, local.exact_values(plan.details, parts, n)


def most_rows_per_unit(paths) -> int:
    """The most rows of one unit, as registration records it (the dataset's
    ``max_rows_per_unit``, which the host passes the engine as a hint)."""
    pid = pq.read_table(paths, columns=["pid"]).column("pid").to_numpy()
    return int(np.bincount(pid - pid.min()).max())


def run_dist(paths, plan, n, scheduler, repeat, most_rows=None):
    """The whole DP request on the cluster (exact parts, then the noise once and the result
    JSON, as ``engines.distributed.aggregates.execute`` does), timed; returns the exact
    values too, for the equality check."""
    cols = tuple(dict.fromkeys(plan.columns + (["pid"] if plan.details["unit_column"] else [])))
    # Each file's range of unit ids as the host passes them: read from the footers by the
    # manifest check every request makes, row-level or not (governance/datasets/partitions.py).
    unit = plan.details["unit_column"]
    ranges = source.file_ranges(paths, unit) if unit else None
    table = PartitionedTable(paths=tuple(paths), columns=cols, num_rows=n, unit_column=unit, scheduler=scheduler,
                             unit_ranges=ranges, max_rows_per_unit=most_rows if unit else None)

    def once():
        parts = dist.exact_parts(table, plan.details, salt=SALT)
        release = local.finish(plan.details, parts, n, np.random.default_rng(), lambda u: None)
        return parts, release.result

    (t, cpu), (parts, result) = timed(once, repeat, scheduler)
    return t, cpu, local.exact_values(plan.details, parts, n), result


def same(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def bench(a) -> dict:
    from distributed import LocalCluster

    paths = sorted(str(p) for p in Path(a.data).glob("*.parquet"))
    n = sum(pq.ParquetFile(p).metadata.num_rows for p in paths)
    names = a.queries.split(",")
    queries = {k: {**QUERIES, **UNIT_QUERIES}[k] for k in names}
    if a.exact:
        queries.update(UNIT_QUERIES)
    log(f"{n:,} rows in {len(paths)} partitions; queries: {', '.join(queries)}; workers {a.workers}")
    out = {"rows": n, "partitions": len(paths), "repeat": a.repeat, "machine": "shared 2-core machine (4 engineers)",
           "load_before": os.getloadavg(), "queries": {}}
    plans = {}
    for name, (kind, params) in queries.items():
        unit = name.startswith("unit_")
        plans[name] = plugins.plan("aggregates", EngineRequest(kind, {"epsilon": 1.0, **params}), meta(n, unit))
        out["queries"][name] = {"kind": kind, "params": params}
    exact_local = {}
    if not a.no_local:
        for name, plan in plans.items():
            t, cpu, t_read, exact_local[name] = run_local(paths, plan, n, a.repeat)
            out["queries"][name]["local"] = {"seconds": t, "cpu_seconds": cpu, "read_seconds": t_read,
                                             "ns_per_row": t / n * 1e9, "load_1min_after": os.getloadavg()[0]}
            log(f"  local engine    {name:13s} {t:8.2f} s  ({t / n * 1e9:6.1f} ns/row; read {t_read:.2f} s; "
                f"CPU {cpu:.2f} s)")
    most_rows = None
    if not a.no_hint and any(p.details["unit_column"] for p in plans.values()):
        most_rows = out["most_rows_per_unit"] = most_rows_per_unit(paths)
        log(f"most rows of one unit (registration's max_rows_per_unit, the engine's hint): {most_rows}")
    for w in [int(x) for x in a.workers.split(",")]:
        with LocalCluster(n_workers=w, threads_per_worker=1, processes=True, dashboard_address=None,
                          host="127.0.0.1", silence_logs=40, memory_limit=a.memory_limit) as cl:
            for name, plan in plans.items():
                t, cpu, exact, answer = run_dist(paths, plan, n, cl.scheduler_address, a.repeat, most_rows)
                rec = {"seconds": t, "cpu_seconds": cpu, "ns_per_row": t / n * 1e9, "dp_answer": answer,
                       "load_1min_after": os.getloadavg()[0]}
                if name in exact_local:
                    rec["exact_equal_to_local"] = same(exact, exact_local[name])
                    rec["ratio_to_local"] = t / out["queries"][name]["local"]["seconds"]
                out["queries"][name][f"dask_{w}"] = rec
                extra = "" if name not in exact_local else \
                    f"  x{rec['ratio_to_local']:.2f} of local; exact equal: {rec['exact_equal_to_local']}"
                log(f"  dask {w} worker(s) {name:13s} {t:8.2f} s  ({t / n * 1e9:6.1f} ns/row; CPU {cpu:.2f} s){extra}")
            for name, q in out["queries"].items():
                rec, twin = q[f"dask_{w}"], out["queries"].get(ROW_TWIN.get(name, ""), {}).get(f"dask_{w}")
                if twin:
                    rec["unit_over_row"] = rec["seconds"] / twin["seconds"]
                    rec["unit_over_row_cpu"] = rec["cpu_seconds"] / twin["cpu_seconds"]
                    log(f"  dask {w} worker(s) {name:13s} unit / row x{rec['unit_over_row']:.2f} "
                        f"(CPU x{rec['unit_over_row_cpu']:.2f})")
            client = dcluster._clients.pop(cl.scheduler_address, None)
            if client is not None:
                client.close()
    out["load_after"] = os.getloadavg()
    return out


def table(res: dict) -> str:
    """Wall seconds (ns/row) and CPU seconds per variant; the ratios in wall time and, after
    the slash, in CPU time (the work done, which the other users' load moves far less)."""
    cols = [k for k in ("local", "dask_1", "dask_2") if any(k in q for q in res["queries"].values())]
    load = "".join(f", load (1/5/15 min) {k.split('_')[1]} " + "/".join(f"{x:.2f}" for x in res[k])
                   for k in ("load_before", "load_after") if k in res)

    def cpu(rec, key="cpu_seconds"):
        return f" / {rec[key]:.2f}" if key in rec else ""

    lines = [f"{res['rows']:,} rows, {res['partitions']} partitions, median of {res['repeat']} "
             f"({res['machine']}{load})", "| query | " + " | ".join(f"{c} s (ns/row) / CPU s" for c in cols) +
             " | dask_2 / local (wall / CPU) | unit / row, dask_1 and dask_2 (wall / CPU) | exact equal |",
             "|---" * (len(cols) + 4) + "|"]
    for name, q in res["queries"].items():
        cells = [f"{q[c]['seconds']:.2f} ({q[c]['ns_per_row']:.1f}){cpu(q[c])}" if c in q else "-" for c in cols]
        d2 = q.get("dask_2", {})
        ratio = "-"
        if "ratio_to_local" in d2:
            ratio = f"{d2['ratio_to_local']:.2f}x"
            if "cpu_seconds" in d2 and "cpu_seconds" in q.get("local", {}):
                ratio += f" / {d2['cpu_seconds'] / q['local']['cpu_seconds']:.2f}x"
        eq = ", ".join(str(q[c]["exact_equal_to_local"]) for c in ("dask_1", "dask_2")
                       if "exact_equal_to_local" in q.get(c, {})) or "-"
        unit = ", ".join(f"{q[c]['unit_over_row']:.2f}x" + (f" / {q[c]['unit_over_row_cpu']:.2f}x"
                                                           if "unit_over_row_cpu" in q[c] else "")
                         for c in ("dask_1", "dask_2") if "unit_over_row" in q.get(c, {})) or "-"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {ratio} | {unit} | {eq} |")
    return "\n".join(lines)


def _rows(n: int) -> str:
    return f"{n / 1e9:g}B" if n >= 1e9 else f"{n / 1e6:g}M"


def plot(files: list[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.5, 4.4))
    for f in files:
        res = json.loads(Path(f).read_text())
        for name in ("count", "grouped_mean"):
            q = res["queries"].get(name)
            if not q:
                continue
            ws = [w for w in (1, 2) if f"dask_{w}" in q]
            line, = ax.plot(ws, [q[f"dask_{w}"]["ns_per_row"] for w in ws], marker="o",
                            label=f"{name}, {_rows(res['rows'])} rows, Dask")
            if "local" in q:
                ax.scatter([0.9], [q["local"]["ns_per_row"]], marker="x", s=60, color=line.get_color(),
                           label=f"{name}, {_rows(res['rows'])} rows, local engine")
    ax.set_xticks([0.9, 1, 2], ["local\nengine", "1", "2 (all cores)"])
    ax.set_xlabel("local Dask workers (processes, 1 thread each); x: the local engine (one process)")
    ax.set_ylabel("ns per row (whole request, read included)")
    ax.set_title("Aggregates on Dask: time per row (shared 2-core machine)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def _dpsgd_table(rows: int, directory: Path) -> list[str]:
    import pyarrow as pa

    rng = np.random.default_rng(20261125)
    x = rng.normal(0, 1, (rows, 20))
    w = rng.normal(0, 1, 20)
    y = rng.random(rows) < 1 / (1 + np.exp(-x @ w))
    table = pa.table({**{f"x{i}": x[:, i] for i in range(20)}, "y": np.where(y, "yes", "no")})
    paths = []
    for i, b in enumerate(np.linspace(0, rows, 9).astype(int)[:-1]):
        path = directory / f"part-{i}.parquet"
        pq.write_table(table.slice(b, rows // 8), path)
        paths.append(str(path))
    return paths


def dpsgd(rows: int, repeat: int) -> int:
    """DP-SGD time per epoch: 1 rank (1 and 2 torch threads) vs 2 ranks, side by side."""
    import os
    import tempfile

    import torch
    from distributed import LocalCluster

    from engines.distributed import training
    from engines.types import Plan

    cols = {f"x{i}": {"type": "numeric", "lower": -4, "upper": 4} for i in range(20)}
    cols["y"] = {"type": "categorical", "domain": ["no", "yes"]}
    ds = DatasetMeta(name="bench", columns=cols, unit_column=None, n_rows=rows, n_units=rows, delta=1e-7)
    base = {"target": "y", "target_epsilon": 3.0, "batch_size": 1024, "model": {"hidden": [256, 256]},
            "canaries": 0, "eval_epsilon": 0.1}
    out = {"rows": rows, "machine": "shared 2-core machine (4 engineers)", "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                         host="127.0.0.1", silence_logs=40) as cl:
        paths = _dpsgd_table(rows, Path(tmp))
        table = PartitionedTable(paths=tuple(paths), columns=tuple(cols), num_rows=rows,
                                 scheduler=cl.scheduler_address)

        def run(ranks: int, epochs: int, threads: int) -> tuple[float, dict]:
            torch.set_num_threads(threads)
            req = EngineRequest("train", {**base, "epochs": epochs, "ranks": ranks})
            plan = Plan(**{k: v for k, v in vars(plugins.plan("dpsgd", req, ds)).items()})
            with tempfile.TemporaryDirectory() as work:
                t0 = time.perf_counter()
                release = training.execute(req, ds, table, plan, lambda _: None, work)
                return time.perf_counter() - t0, release.result

        variants = [("1 rank, 1 thread", 1, 1), ("1 rank, 2 threads", 1, 2), ("2 ranks, 1 thread each", 2, 1)]
        run(2, 1, 1), run(1, 1, 1)  # warm-up: torch imported on the Dask workers and here
        times = {label: {1: [], 3: []} for label, _, _ in variants}
        last = {}
        for i in range(repeat):  # every variant once per round, in rotating order
            for label, ranks, threads in variants[i % 3:] + variants[:i % 3]:
                for epochs in (1, 3):
                    t, r = run(ranks, epochs, threads)
                    assert r["ranks"] == ranks and r["steps"] == r["planned_steps"], r
                    times[label][epochs].append(t)
                    last[label] = r
                log(f"  round {i + 1}: {label:24s} 1 epoch {times[label][1][-1]:6.2f} s, "
                    f"3 epochs {times[label][3][-1]:6.2f} s")
        res = {}
        for label, _, _ in variants:
            t1, t3, r3 = statistics.median(times[label][1]), statistics.median(times[label][3]), last[label]
            res[label] = {"t1": t1, "t3": t3, "epoch": (t3 - t1) / 2, "steps_per_epoch": r3["steps"] // 3,
                          "val_accuracy": r3["history"][-1].get("val_accuracy"), "sample_rate": r3["sample_rate"],
                          "runs": times[label]}
    out["load_after"] = os.getloadavg()
    out["variants"] = res
    one = res["1 rank, 1 thread"]["epoch"]
    print(f"DP-SGD, {rows:,} rows, medians of {repeat} rounds, expected batch 1024, MLP 20-256-256-1, "
          f"{res['1 rank, 1 thread']['steps_per_epoch']} steps/epoch, sample rate "
          f"{res['1 rank, 1 thread']['sample_rate']:.5f} (the same plan for every row); load "
          f"{out['load_before'][0]:.2f} -> {out['load_after'][0]:.2f} (shared 2-core machine)")
    print("| variant | 1 epoch run s | 3 epochs run s | s per epoch | vs 1 rank, 1 thread | DP val. accuracy |")
    print("|---|---|---|---|---|---|")
    for label, r in res.items():
        print(f"| {label} | {r['t1']:.2f} | {r['t3']:.2f} | {r['epoch']:.2f} | {one / r['epoch']:.2f}x | "
              f"{r['val_accuracy']:.3f} |")
    path = REPO / "var" / "bench" / f"dpsgd-ranks-{rows}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="directory of Parquet partitions (bench/gen_partitions.py)")
    ap.add_argument("--queries", default="count,grouped_mean,sum,histogram,quantile")
    ap.add_argument("--workers", default="1,2", help="Dask worker counts to measure")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--exact", action="store_true", help="also the unit-level queries (unit buckets)")
    ap.add_argument("--no-hint", action="store_true",
                    help="do not pass the engine the registered most rows of one unit (no row-level try)")
    ap.add_argument("--no-local", action="store_true", help="skip the local engine (a table too big for one process)")
    ap.add_argument("--memory-limit", default="4GB", help="per Dask worker")
    ap.add_argument("--json", help="where to write the results")
    ap.add_argument("--plot", nargs="+", help="plot these result files into bench/distributed_scaling.png")
    ap.add_argument("--dpsgd", type=lambda v: int(v.replace("_", "")), metavar="ROWS",
                    help="DP-SGD: 1 vs 2 ranks on ROWS generated rows, time per epoch")
    a = ap.parse_args(argv)
    if a.dpsgd:
        return dpsgd(a.dpsgd, a.repeat)
    if a.plot:
        plot(a.plot, REPO / "bench" / "distributed_scaling.png")
        return 0
    if not a.data:
        ap.error("--data is required")
    res = bench(a)
    path = Path(a.json or REPO / "var" / "bench" / f"distributed-{res['rows']}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=2))
    print(table(res))
    bad = [n for n, q in res["queries"].items() for c in ("dask_1", "dask_2")
           if q.get(c, {}).get("exact_equal_to_local") is False]
    if bad:
        print(f"EXACT AGGREGATES DIFFER: {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
