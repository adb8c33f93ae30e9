"""Worker kills at random points of unit-level queries on a Dask cluster that models two
hosts (2 worker processes under Nannies, each with its own local directory and TMPDIR, no
shared scratch), on Parquet partitions from bench/gen_partitions.py (each unit's rows
spread over every partition):

    .venv/bin/python bench/gen_partitions.py --rows 5_000_000 --partitions 20 --out var/bench/parts-5M-20
    .venv/bin/python bench/bench_worker_loss.py --data var/bench/parts-5M-20 --kills 20

(on partitions written with ``--by-unit``, each file its own range of unit ids, the two
queries at k = 2 run file by file instead of dealing rows: ``aggregates._within_files``)

Each trial picks a unit-level query (bench_distributed.UNIT_QUERIES: a count per unit id,
a sum whose k no unit exceeds (row-level, counted per unit beside), two with k below
most units' rows (dealt into unit buckets); the engine gets the unit ids' range and the
registered most rows of one unit, as the host passes them) and a point in
[5%, 95%] of that query's undisturbed run time, runs the query through
``engines.distributed.aggregates.exact_parts`` (what a request runs; task retries 2, as
``DASK_TASK_RETRIES``' default) and SIGKILLs one of the two workers (chosen at random) at
that point; its Nanny starts a new one. Outcomes: ``exact`` (the exact aggregate equals the
local engine's with the same bounding salt), ``failed`` (the run raised: nothing would be
released) or ``WRONG`` (a different number: what must never happen). After every trial it
waits for 2 workers and lists every file under the two hosts' directories but Dask's empty
lock files: ``bytes_left`` must stay 0. Results: stdout and var/bench/worker-loss.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import pyarrow.parquet as pq  # noqa: E402

from bench_distributed import SALT, UNIT_QUERIES, meta, most_rows_per_unit, same  # noqa: E402
from engines import plugins  # noqa: E402
from engines.aggregates import execute as local  # noqa: E402
from engines.distributed import PartitionedTable  # noqa: E402
from engines.distributed import aggregates as dist  # noqa: E402
from engines.distributed import cluster as dcluster  # noqa: E402
from engines.distributed import source as source_mod  # noqa: E402
from engines.types import EngineRequest  # noqa: E402


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def files_left(dirs: list[Path]) -> dict:
    out = {}
    for d in dirs:
        for p in d.rglob("*"):
            if p.is_file() and not (p.name.endswith((".lock", ".dirlock")) and p.stat().st_size == 0):
                out[str(p)] = p.stat().st_size
    return out


def hosts_cluster(base: Path, memory_limit: str):
    from distributed import Nanny, Scheduler, SpecCluster

    dirs, workers = [], {}
    for i in range(2):
        d = base / f"host{i}"
        (d / "tmp").mkdir(parents=True)
        dirs.append(d)
        workers[f"host{i}"] = {"cls": Nanny, "options": {
            "nthreads": 1, "local_directory": str(d), "host": "127.0.0.1", "dashboard": False, "silence_logs": 40,
            "memory_limit": memory_limit, "env": {"TMPDIR": str(d / "tmp"), "DASK_TEMPORARY_DIRECTORY": str(d)}}}
    cl = SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {"host": "127.0.0.1",
                                                                               "dashboard": False}}, silence_logs=40)
    return cl, dirs


def heal(cl, c) -> bool:
    """Wait for 2 workers; a Nanny that gave up restarting its worker (seen on this loaded
    machine: the SpecCluster then drops it) is started again from its spec, same host
    directory. Returns whether one was."""
    try:
        c.wait_for_workers(2, timeout=60)
        return False
    except TimeoutError:
        pass
    for name, w in list(cl.workers.items()):
        if w.status.name in ("closed", "closing", "failed"):
            del cl.workers[name]
    cl.sync(cl._correct_state)
    c.wait_for_workers(2, timeout=120)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=23)
    ap.add_argument("--memory-limit", default="4GB")
    ap.add_argument("--json", default=str(REPO / "var" / "bench" / "worker-loss.json"))
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    paths = sorted(str(p) for p in Path(a.data).glob("*.parquet"))
    n = sum(pq.ParquetFile(p).metadata.num_rows for p in paths)
    plans = {name: plugins.plan("aggregates", EngineRequest(kind, {"epsilon": 1.0, **params}), meta(n, True))
             for name, (kind, params) in UNIT_QUERIES.items()}
    want = {}
    for name, plan in plans.items():
        cols = list(dict.fromkeys(plan.columns + ["pid"]))
        table = pq.read_table(paths, columns=cols)
        want[name] = local.exact_values(plan.details, local.exact_parts(plan.details, table, n, None, salt=SALT), n)
        del table
    most = most_rows_per_unit(paths)  # what registration records, passed by the host as a hint
    log(f"{n:,} rows in {len(paths)} partitions; local exact answers computed; most rows of one unit {most}")
    trials, load_before = [], os.getloadavg()
    with tempfile.TemporaryDirectory(dir=REPO / "var") as base:
        cl, dirs = hosts_cluster(Path(base), a.memory_limit)
        try:
            c = dcluster.client(cl.scheduler_address)
            c.wait_for_workers(2, timeout=120)

            ranges = source_mod.file_ranges(paths, "pid")  # as the host's manifest check reads them

            def source(plan):
                cols = tuple(dict.fromkeys(plan.columns + ["pid"]))
                return PartitionedTable(paths=tuple(paths), columns=cols, num_rows=n, unit_column="pid",
                                        scheduler=cl.scheduler_address, retries=2, unit_ranges=ranges,
                                        max_rows_per_unit=most)

            undisturbed = {}
            for name, plan in plans.items():  # warm-up and the undisturbed time of each query
                t0 = time.perf_counter()
                got = dist.exact_parts(source(plan), plan.details, salt=SALT)
                undisturbed[name] = time.perf_counter() - t0
                assert same(local.exact_values(plan.details, got, n), want[name]), name
                log(f"  {name}: {undisturbed[name]:.2f} s undisturbed, exact")
            for i in range(a.kills):
                name = rng.choice(sorted(plans))
                plan = plans[name]
                delay = rng.uniform(0.05, 0.95) * undisturbed[name]
                pids = c.run(os.getpid)
                victim = pids[rng.choice(sorted(pids))]
                killed = {}

                def kill(victim=victim, delay=delay, killed=killed):
                    time.sleep(delay)
                    os.kill(victim, signal.SIGKILL)
                    killed["at"] = time.perf_counter()

                t0 = time.perf_counter()
                threading.Thread(target=kill, daemon=True).start()
                try:
                    got = dist.exact_parts(source(plan), plan.details, salt=SALT)
                    outcome = "exact" if same(local.exact_values(plan.details, got, n), want[name]) else "WRONG"
                    error = None
                except Exception as e:  # noqa: BLE001 - a failed run: nothing would be released
                    import traceback

                    outcome, error = "failed", f"{type(e).__name__}: {str(e)[:200]}"
                    log("".join(traceback.format_exception(e))[-3000:])
                t1 = time.perf_counter()
                time.sleep(max(0.0, delay - (t1 - t0)) + 0.2)
                replaced = heal(cl, c)
                time.sleep(0.5)
                left = files_left(dirs)
                trial = {"trial": i + 1, "query": name, "kill_after_s": round(delay, 3), "run_s": round(t1 - t0, 3),
                         "killed_during_run": "at" in killed and killed["at"] < t1, "outcome": outcome,
                         "error": error, "files_left": len(left), "bytes_left": sum(left.values()),
                         "nanny_replaced": replaced}
                trials.append(trial)
                log(f"  {i + 1:2d} {name:18s} kill at {delay:5.2f} s, run {t1 - t0:5.2f} s "
                    f"(undisturbed {undisturbed[name]:.2f}): {outcome}{' ' + error if error else ''}; "
                    f"left {trial['bytes_left']} bytes in {trial['files_left']} files")
        finally:
            c = dcluster._clients.pop(cl.scheduler_address, None)
            if c is not None:
                c.close()
            cl.close()
    summary = {o: sum(t["outcome"] == o for t in trials) for o in ("exact", "failed", "WRONG")}
    summary["killed_during_run"] = sum(t["killed_during_run"] for t in trials)
    summary["bytes_left"] = sum(t["bytes_left"] for t in trials)
    out = {"rows": n, "partitions": len(paths), "kills": a.kills, "seed": a.seed, "undisturbed_s": undisturbed,
           "load_before": load_before, "load_after": os.getloadavg(), "summary": summary, "trials": trials}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=2))
    print(f"{n:,} rows, {len(paths)} partitions, {a.kills} kills (seed {a.seed}): {summary}")
    print("| trial | query | kill after s | run s | killed during run | outcome | bytes left |")
    print("|---|---|---|---|---|---|---|")
    for t in trials:
        print(f"| {t['trial']} | {t['query']} | {t['kill_after_s']:.2f} | {t['run_s']:.2f} | "
              f"{t['killed_during_run']} | {t['outcome']} | {t['bytes_left']} |")
    return 1 if summary["WRONG"] or summary["bytes_left"] else 0


if __name__ == "__main__":
    sys.exit(main())
