#!/usr/bin/env python
"""Admission benchmark: the cost of the gate (``governance.ledger.actions.admit``) against a bare
insert of a ledger row, on the same throwaway database, in one run.

    .venv/bin/python bench/bench_admission.py                 # SQLite, N = 100000
    .venv/bin/python bench/bench_admission.py --postgres      # fresh `bench_admission` db
    .venv/bin/python bench/bench_admission.py --both          # SQLite then PostgreSQL
    .venv/bin/python bench/bench_admission.py --n 2000        # CI smoke
    .venv/bin/python bench/bench_admission.py --profile 2000  # + cProfile of 2000 admissions

What is measured (all with time.perf_counter_ns, after warm-up, medians and p95):

* admit      ``ledger.admit(ds, analyst, {"kind": "laplace", "epsilon": 1e-7})`` by an
             analyst holding a grant (no cap), a Laplace event given as JSON;
* orm insert ``LedgerEntry.objects.create(...)`` inside ``transaction.atomic()`` with the
             event/cost/charge payloads of a real admitted entry (same JSON sizes);
* raw insert the same row through ``connection.cursor().execute(INSERT ...)`` inside
             ``transaction.atomic()`` (BEGIN [IMMEDIATE] / INSERT / COMMIT), JSON
             serialised with json.dumps in the timed region;
  the three are interleaved (rotating order) in a window of ``--window`` iterations at
  ledger admission #10 and again at admission #N, after the ledger has been filled to N
  entries through real admissions. Bare inserts go to a second dataset so the measured
  ledger holds admissions only (the table is shared).
* fill       every admission of the fill is timed too: its wall-clock rate is the
             single-client admissions/s, and medians per tenth of the fill show drift;
* gaussian / subsampled_gaussian admissions (no delta stated: the ledger stamps one), each
  on its own dataset; DP-SGD both with a (q, sigma) never seen before in the run ("new",
  sigma = 1.1 + k*1e-9, so no curve cache can answer) and with the same event repeated.
* compute    the pure-Python part of an admission without any SQL (_plan, filter check,
             charge_summary, to_dict/to_json), and the number of SQL statements per admit.

Only measured numbers are printed. The database is created here and thrown away: a
SQLite file in a temp dir (WAL, synchronous=FULL, BEGIN IMMEDIATE, as in settings), or
a PostgreSQL database dropped and recreated on the local server
(``scripts/services.sh``; base URL from $DATABASE_URL if it is a postgres URL).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, drop_database, pg_base_url, prepare_environment, write_csv

PG_DB = "bench_admission"
RESULT_TAG = "BENCH_RESULT_JSON "

LAPLACE = {"kind": "laplace", "epsilon": 1e-7}
GAUSSIAN = {"kind": "gaussian", "noise_multiplier": 1.0}
SGD = {"kind": "subsampled_gaussian", "sample_rate": 0.004, "noise_multiplier": 1.1, "steps": 3000}
_cold = iter(range(1, 10**9))


def sgd_cold() -> dict:
    """The DP-SGD event with a noise multiplier never seen before in this run (1.1 + k * 1e-9),
    so that no cache of RDP curves keyed on the parameters can answer it."""
    return {**SGD, "noise_multiplier": 1.1 + next(_cold) * 1e-9}


# --------------------------------------------------------------------------- stats


def stats(samples_ns: list[int]) -> dict:
    s = sorted(samples_ns)
    n = len(s)
    q = lambda p: s[min(n - 1, max(0, int(round(p * (n - 1)))))]  # noqa: E731
    return {"n": n, "median_us": statistics.median(s) / 1e3, "p95_us": q(0.95) / 1e3,
            "min_us": s[0] / 1e3, "max_us": s[-1] / 1e3}


# --------------------------------------------------------------------------- the run


def run(backend: str, args) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-admission-{backend}-"))
    try:
        where = prepare_environment(backend, tmp, PG_DB)
        return _run(backend, args, tmp, where)
    finally:
        try:
            from django.db import connections

            connections.close_all()
        except Exception:  # pragma: no cover
            pass
        if backend == "postgres" and not args.keep:
            drop_database(pg_base_url(), PG_DB)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"(kept {tmp})", file=sys.stderr)


def _run(backend: str, args, tmp: Path, where: str) -> dict:
    sys.path.insert(0, str(REPO))
    import django

    django.setup()
    import gc

    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from governance.datasets import registry as datasets
    from governance.ledger import actions as ledger
    from governance.models import Grant, LedgerEntry
    from governance.ledger import grants

    perf = time.perf_counter_ns
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if not args.quiet else (lambda *a: None)
    t_start = time.monotonic()
    load_start = os.getloadavg()
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "governance"],
                               capture_output=True, text=True).stdout.strip()
        code = f"{head}{' + uncommitted changes in governance/' if dirty else ''}"
    except OSError:
        code = "unknown"
    log(f"[{backend}] {where}")
    call_command("migrate", verbosity=0, interactive=False)
    assert settings.DATA_DIR == tmp / "data" and settings.DATASET_IMPORT_DIRS == [tmp / "import"]

    User = get_user_model()
    officer = User.objects.create_user("olivia", is_staff=True)
    analyst = User.objects.create_user("ann")
    csv = tmp / "import" / "clinic.csv"
    write_csv(csv)
    schema = {"age": {"lower": 18, "upper": 90}, "income": {"lower": 0, "upper": 200_000}}

    def make(name, epsilon):
        ds = datasets.register(name=name, created_by=officer, path=str(csv), budget_epsilon=epsilon,
                               budget_delta="auto", policy="rdp", schema=schema, activate=True)
        grants.give(analyst, ds, officer)
        return ds

    ds_ledger = make("ledger", 1000.0)  # the measured ledger: N admissions of epsilon 1e-7
    ds_bare = make("bare", 1000.0)  # bare inserts land here
    ds_warm = make("warmup", 1000.0)
    ds_gauss = make("gauss", 1e6)  # (the largest budget a dataset may have)
    ds_sgd = make("sgd", 1e6)
    grant_bare = Grant.objects.get(dataset=ds_bare, analyst=analyst)

    # Payloads of a real admission (same JSON sizes for the bare inserts).
    sample = ledger.admit(ds_warm, analyst, dict(LAPLACE))
    payload = {"event": sample.event, "cost": sample.cost, "charge": sample.charge}
    sizes = {k: len(json.dumps(v)) for k, v in payload.items()}

    table = LedgerEntry._meta.db_table
    cols = ["dataset_id", "analyst_id", "grant_id", "reference", "event", "cost", "charge", "status", "created_at",
            "non_private"]
    js = "::jsonb" if connection.vendor == "postgresql" else ""
    values = ["%s", "%s", "%s", "%s", f"%s{js}", f"%s{js}", f"%s{js}", "%s", "%s", "%s"]
    raw_sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join(values)})"

    def admit_once(ds, event=LAPLACE):
        t0 = perf()
        ledger.admit(ds, analyst, dict(event))
        return perf() - t0

    def orm_once():
        t0 = perf()
        with transaction.atomic():
            LedgerEntry.objects.create(dataset_id=ds_bare.pk, analyst=analyst, grant=grant_bare, reference="",
                                       event=payload["event"], cost=payload["cost"], charge=payload["charge"])
        return perf() - t0

    def raw_once():
        t0 = perf()
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute(raw_sql, [ds_bare.pk, analyst.pk, grant_bare.pk, "", json.dumps(payload["event"]),
                                      json.dumps(payload["cost"]), json.dumps(payload["charge"]), "reserved",
                                      connection.ops.adapt_datetimefield_value(timezone.now()), False])
        return perf() - t0

    # ---- warm-up: code paths, statement caches, lazy imports (on a separate dataset).
    for _ in range(args.warmup):
        admit_once(ds_warm)
        orm_once()
        raw_once()
    admit_once(ds_gauss, GAUSSIAN)
    admit_once(ds_sgd, SGD)
    with connection.cursor() as cur:  # leave the table with the measured ledger only
        cur.execute(f"DELETE FROM {table} WHERE dataset_id IN (%s, %s)", [ds_bare.pk, ds_warm.pk])

    # ---- queries per admission and the compute-only part of one admission
    with CaptureQueriesContext(connection) as cq:
        admit_once(ds_warm)
    n_queries = len(cq.captured_queries)
    query_kinds = [q["sql"].split()[0].upper() for q in cq.captured_queries]
    from accounting.costs import Cost  # noqa: F401
    from governance.models import Budget, Dataset

    b = Budget.objects.get(pk=ds_ledger.pk)
    d = Dataset.objects.get(pk=ds_ledger.pk)
    g = Grant.objects.get(dataset=ds_ledger, analyst=analyst)

    def compute_once(event):
        t0 = perf()
        stamped, cost, limits = ledger._plan(dict(event), d, b, g)
        for limit, state in limits:
            limit.holds(state + cost, lambda fields: {})  # far from the limit: no exact sums read
        stamped.to_dict(), cost.to_json(), ledger.charge_summary(cost, d.budget_delta)
        new = ledger.Cost.from_json(b.state) + cost
        new.to_json()
        (ledger.Cost.from_json(g.state) + cost).to_json()
        return perf() - t0

    compute = [compute_once(LAPLACE) for _ in range(args.window + 50)][50:]
    compute_gauss = [compute_once(GAUSSIAN) for _ in range(args.gauss_samples)]
    compute_sgd = [compute_once(sgd_cold()) for _ in range(args.sgd_samples)]
    compute_once(SGD)
    compute_sgd_warm = [compute_once(SGD) for _ in range(args.gauss_samples)]

    # ---- window around admission #10
    W, N = args.window, args.n
    for _ in range(9):
        admit_once(ds_ledger)
    admitted = 9
    fns = {"admit": lambda: admit_once(ds_ledger), "orm": orm_once, "raw": raw_once}

    def window(label):
        nonlocal admitted
        out = {k: [] for k in fns}
        order = list(fns)
        first = admitted + 1
        gc.collect()
        for i in range(W):
            rot = order[i % len(order):] + order[:i % len(order)]
            for k in rot:
                out[k].append(fns[k]())
        admitted += W
        log(f"[{backend}] window {label}: admissions #{first}..#{admitted}")
        return {"first": first, "last": admitted, **{k: stats(v) for k, v in out.items()}}

    early = window("early")

    # ---- fill to N - W through real admissions, each timed
    fill_target = N - W
    fill = []
    t_fill = time.monotonic()
    last_log = t_fill
    while admitted < fill_target:
        fill.append(admit_once(ds_ledger))
        admitted += 1
        if not args.quiet and time.monotonic() - last_log > 15:
            last_log = time.monotonic()
            log(f"[{backend}] fill: {admitted}/{fill_target} ({len(fill) / (last_log - t_fill):.0f}/s)")
    fill_wall = time.monotonic() - t_fill
    late = window("late")

    # ---- gaussian and DP-SGD admissions
    gauss = [admit_once(ds_gauss, GAUSSIAN) for _ in range(args.gauss_samples)]
    sgd = [admit_once(ds_sgd, sgd_cold()) for _ in range(args.sgd_samples)]
    sgd_warm = [admit_once(ds_sgd, SGD) for _ in range(args.gauss_samples)]

    # ---- sanity: the ledger holds N admissions and its running state matches a recompute
    count = LedgerEntry.objects.filter(dataset=ds_ledger).count()
    total_rows = LedgerEntry.objects.count()
    state = ledger.Cost.from_json(Budget.objects.get(pk=ds_ledger.pk).state)
    ok_state = bool(abs(state.eps - ledger.recompute_state(ds_ledger.pk).eps) < 1e-9)

    chunks = []
    if fill:
        k = max(1, len(fill) // 10)
        chunks = [statistics.median(fill[i:i + k]) / 1e3 for i in range(0, len(fill) - k + 1, k)][:10]

    prof = None
    if args.profile:
        import cProfile
        import io
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for _ in range(args.profile):
            ledger.admit(ds_warm, analyst, dict(LAPLACE))
        pr.disable()
        buf = io.StringIO()
        st = pstats.Stats(pr, stream=buf)
        st.sort_stats("tottime").print_stats(25)
        st.sort_stats("cumulative").print_stats(45)
        prof = buf.getvalue()

    return {
        "backend": backend, "where": where, "n": N, "window": W, "ledger_entries": count, "table_rows": total_rows,
        "state_matches_recompute": ok_state, "payload_bytes": sizes, "queries_per_admit": n_queries,
        "query_kinds": query_kinds, "early": early, "late": late,
        "fill": {"admissions": len(fill), "wall_s": fill_wall, **(stats(fill) if fill else {}),
                 "per_s": len(fill) / fill_wall if fill_wall else None, "decile_medians_us": chunks},
        "compute": stats(compute), "compute_gauss": stats(compute_gauss), "compute_sgd": stats(compute_sgd),
        "compute_sgd_warm": stats(compute_sgd_warm), "sgd_warm": stats(sgd_warm), "gaussian": stats(gauss), "sgd": stats(sgd),
        "elapsed_s": time.monotonic() - t_start, "loadavg": [load_start[0], os.getloadavg()[0]], "code": code, "profile": prof,
    }


# --------------------------------------------------------------------------- report


def report(results: list[dict]) -> str:
    lines = []
    add = lines.append
    for r in results:
        add(f"== {r['backend']}: {r['where']}; code at git {r['code']}")
        add(f"   ledger entries {r['ledger_entries']:,} (table rows {r['table_rows']:,}); running state == recompute: "
            f"{r['state_matches_recompute']}; payload bytes event/cost/charge "
            f"{r['payload_bytes']['event']}/{r['payload_bytes']['cost']}/{r['payload_bytes']['charge']}; "
            f"SQL per admit {r['queries_per_admit']} ({' '.join(r['query_kinds'])}); run {r['elapsed_s']:.0f}s; "
            f"1-min load avg start/end {r['loadavg'][0]:.2f}/{r['loadavg'][1]:.2f} ({os.cpu_count()} CPUs)")
    hdr = f"{'measure (us)':<44}" + "".join(f"{r['backend'] + ' median':>16}{'p95':>10}" for r in results)
    add("")
    add(hdr)
    add("-" * len(hdr))

    def row(label, get):
        cells = ""
        for r in results:
            s = get(r)
            cells += f"{s['median_us']:>16,.0f}{s['p95_us']:>10,.0f}" if s else f"{'-':>16}{'-':>10}"
        add(f"{label:<44}{cells}")

    def ratio_row(label, num, den):
        cells = ""
        for r in results:
            cells += f"{num(r)['median_us'] / den(r)['median_us']:>15.2f}x{'':>10}"
        add(f"{label:<44}{cells}")

    for w in ("early", "late"):
        first = results[0][w]
        tag = "#10" if w == "early" else "#N"
        rng = f"#{first['first']:,}-#{first['last']:,}"
        row(f"admit laplace @{tag} ({rng})", lambda r, w=w: r[w]["admit"])
        row(f"  bare ORM create+commit @{tag}", lambda r, w=w: r[w]["orm"])
        row(f"  bare raw cursor insert+commit @{tag}", lambda r, w=w: r[w]["raw"])
        ratio_row(f"  ratio admit / ORM insert @{tag}", lambda r, w=w: r[w]["admit"], lambda r, w=w: r[w]["orm"])
        ratio_row(f"  ratio admit / raw insert @{tag}", lambda r, w=w: r[w]["admit"], lambda r, w=w: r[w]["raw"])
    ratio_row("admit @#N / admit @#10 (goal: ~1)", lambda r: r["late"]["admit"], lambda r: r["early"]["admit"])
    row("admit during fill (all fill admissions)", lambda r: r["fill"] if r["fill"].get("n") else None)
    row("admit gaussian (z=1, delta stamped)", lambda r: r["gaussian"])
    row("admit subsampled_gaussian, new (q,sigma)", lambda r: r["sgd"])
    row("admit subsampled_gaussian, repeated (q,sigma)", lambda r: r["sgd_warm"])
    row("compute only (no SQL): laplace admit", lambda r: r["compute"])
    row("compute only (no SQL): gaussian admit", lambda r: r["compute_gauss"])
    row("compute only (no SQL): DP-SGD, new (q,sigma)", lambda r: r["compute_sgd"])
    row("compute only (no SQL): DP-SGD, repeated", lambda r: r["compute_sgd_warm"])
    add("")
    for r in results:
        f = r["fill"]
        if f.get("n"):
            add(f"{r['backend']}: admissions/s single client: {f['per_s']:,.0f} over the fill "
                f"({f['admissions']:,} admits in {f['wall_s']:.1f}s); 1e6/median @#10 = "
                f"{1e6 / r['early']['admit']['median_us']:,.0f}, @#N = {1e6 / r['late']['admit']['median_us']:,.0f}")
            add(f"{r['backend']}: fill median per tenth (us): " + " ".join(f"{x:,.0f}" for x in f["decile_medians_us"]))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--sqlite", action="store_true", help="SQLite file in a temp dir (default)")
    g.add_argument("--postgres", action="store_true", help="fresh database bench_admission on the local server")
    g.add_argument("--both", action="store_true", help="SQLite then PostgreSQL, one table")
    p.add_argument("--n", type=int, default=100_000, help="ledger size reached through admissions (default 100000)")
    p.add_argument("--window", type=int, default=200, help="timed iterations per window (default 200)")
    p.add_argument("--warmup", type=int, default=100, help="warm-up iterations of each operation (default 100)")
    p.add_argument("--gauss-samples", type=int, default=100)
    p.add_argument("--sgd-samples", type=int, default=30)
    p.add_argument("--profile", type=int, default=0, metavar="K", help="cProfile K laplace admissions, print top")
    p.add_argument("--keep", action="store_true", help="keep the temp dir / database")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # child mode for --both
    args = p.parse_args(argv)
    if args.n < 2 * args.window + 10:
        args.window = max(10, (args.n - 10) // 2)

    if args.both:
        results = []
        for flag in ("--sqlite", "--postgres"):
            cmd = [sys.executable, __file__, flag, "--json", *_passthrough(argv if argv is not None else sys.argv[1:])]
            out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout
            results.append(json.loads(next(ln[len(RESULT_TAG):] for ln in out.splitlines() if ln.startswith(RESULT_TAG))))
    else:
        results = [run("postgres" if args.postgres else "sqlite", args)]
    if args.json:
        print(RESULT_TAG + json.dumps(results[0]))
        return
    print(report(results))
    for r in results:
        if r.get("profile"):
            print(f"\n== cProfile, {args.profile} laplace admissions on {r['backend']}\n{r['profile']}")


def _passthrough(argv):
    return [a for a in argv if a not in ("--both", "--sqlite", "--postgres")]


if __name__ == "__main__":
    main()
