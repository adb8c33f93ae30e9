#!/usr/bin/env python
"""Load benchmark: many concurrent clients making admissions against one dataset on
PostgreSQL, through the REST API with the real server (gunicorn) and real Celery workers.

    .venv/bin/python bench/bench_load.py               # full: 100,000 POSTs, 64 clients, one web restart (~72 min here)
    .venv/bin/python bench/bench_load.py --quick       # CI size: 1,000 POSTs, 64 clients, one web restart (~1 min)
    .venv/bin/python bench/bench_load.py --requests 20000 --clients 32 --no-fault --profile

What it starts (and stops): PostgreSQL and Redis through scripts/services.sh when they do
not answer (left running: they are shared), a scratch database ``--db`` (dropped and
recreated, migrated, dropped at the end unless ``--keep``), Redis db ``--redis-db``
(flushed before and after), a temp DATA_DIR with one 200-row CSV registered as dataset
``load`` (rdp policy, delta 1e-6, an epsilon budget sized so that about
``--admit-fraction`` of the requests fit), ``--analysts`` analysts with tokens and grants
(``--capped`` of them with a cap that about a quarter of their share fits), then the real
processes of the image: ``deploy/entrypoint.sh web`` (gunicorn gthread, DEBUG=false, a
real SECRET_KEY, ALLOWED_HOSTS, the PostgreSQL DATABASE_URL, REDIS_URL; GUNICORN_WORKERS /
GUNICORN_THREADS from ``--gunicorn-workers`` / ``--threads``, the entrypoint's other
defaults, max-requests 20,000 +- 2,000 included; GUNICORN_MAX_REQUESTS in the
environment overrides it) and ``deploy/entrypoint.sh worker`` (``manage.py
worker -Q cpu,gpu -c --celery``, prefork).

Clients: ``--clients`` threads over up to 4 processes, each with its own keep-alive
``http.client`` connection and one analyst's token (client c uses analyst c mod A), POST
/api/requests/ ``{"dataset": "load", "engine": "aggregates", "kind": "count", "params":
{"epsilon": 0.01 * (1 + k * 1e-9)}}`` for k = 0 .. N-1 (each k once: its parameters are
new, so every POST is a new admission, never a free replay; k can be read back from the
stored params). A connection error is retried with the same k (back-off up to 1 s, for
up to ``--retry-for`` seconds); an error after the request may have been sent is counted
as ambiguous. They do not poll: the workers' progress is read from the database.

Fault (unless ``--no-fault``): at ``--fault-at`` of the requests the web server is
stopped as a container is (SIGTERM to gunicorn's master, graceful) and started again on
the same port; the clients retry through the gap.

Afterwards: wait until no request of the dataset is queued or running (``--drain-timeout``),
then the reliability report, from the database: requests attempted / admitted (202) /
refused (409 budget.exceeded, dataset or grant scope) / other 4xx / 5xx / no answer;
lost (a 202 whose request is missing or not final, or a k never answered); requests in
the database no client was told about; one request per admitted k; overspent (the
dataset's and each grant's spend recomputed from the ledger, under the gating filter,
above its budget or cap; also the budget row's running state against the recompute);
ledger entries left reserved; audit records per action against the ledger and the
refusals, the chain length, and ``manage.py audit verify`` of the dataset. Throughput
(admissions/s, POSTs/s, completed requests/s) and POST latency percentiles, CPU seconds
per component, and, with the server and workers stopped, the same gate in this process
(``ledger.admit`` and ``submission.submit`` in a loop, one client) for comparison.
The last line is ``LOAD_RESULT_JSON {...}`` (tests/load parses it). Exit status 1 if a
must-be-zero figure is not zero. Only measured numbers are printed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import multiprocessing as mp
import os
import platform
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import (  # noqa: F401  (bench_faults.py uses them as bench_load's)
    DEFAULT_PG,
    REPO,
    create_database,
    drop_database,
    free_port,
    log,
    ms,
    pg_base_url,
    pg_conninfo,
    quantile,
    release_stack,
    write_csv,
)

PY = sys.executable
REDIS_PORT = int(os.environ.get("REDIS_PORT", "63799"))
DATASET = "load"
FINAL = ("succeeded", "failed", "cancelled")
RESULT_TAG = "LOAD_RESULT_JSON "
BASE_EPSILON = 0.01
BUDGET_DELTA = 1e-6


def epsilon_of(k: int) -> float:
    return BASE_EPSILON * (1 + k * 1e-9)


def k_of(epsilon: float) -> int:
    return int(round((epsilon / BASE_EPSILON - 1) / 1e-9))


# --------------------------------------------------------------------------- services


def pg_up(base: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(**pg_conninfo(base), connect_timeout=2):
            return True
    except psycopg.Error:
        return False


def redis_up() -> bool:
    import redis

    try:
        return bool(redis.Redis(host="127.0.0.1", port=REDIS_PORT, socket_connect_timeout=1).ping())
    except Exception:  # noqa: BLE001
        return False


def ensure_services(base: str) -> list[str]:
    """Start PostgreSQL / Redis with scripts/services.sh when they do not answer."""
    started = []
    for name, up in (("postgres", lambda: pg_up(base)), ("redis", redis_up)):
        if not up():
            r = subprocess.run([str(REPO / "scripts" / "services.sh"), f"{name}-start"])
            if r.returncode != 0 or not up():
                raise SystemExit(f"could not start {name} with scripts/services.sh {name}-start")
            started.append(name)
    return started


def git_code() -> str:
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "engines", "governance",
                                "workers", "deploy"], capture_output=True, text=True).stdout.strip()
        return head + (" + uncommitted changes in engines/, governance/, workers/ or deploy/" if dirty else "")
    except OSError:
        return "unknown"


def machine() -> str:
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        pass
    return (f"{os.cpu_count()} CPUs{mem}, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}")


# --------------------------------------------------------------------------- CPU accounting


def _proc_stat(pid: int):
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    comm = data[data.index("(") + 1:data.rindex(")")]
    fields = data[data.rindex(")") + 2:].split()
    return comm, int(fields[2]), int(fields[11]) + int(fields[12])  # comm, pgrp, utime + stime


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class CpuMeter:
    """CPU seconds per component, sampled from /proc every few seconds: processes of our
    process groups (web, worker, clients), PostgreSQL backends of our database and Redis.
    A process that exits between two samples loses its last interval (a few seconds of a
    recycled gunicorn worker or a closed PostgreSQL backend): a lower bound."""

    def __init__(self, db_name: str):
        self.db_name = db_name
        self.groups: dict[int, str] = {}
        self.first: dict[int, tuple[str, int]] = {}
        self.last: dict[int, tuple[str, int]] = {}
        self.hz = os.sysconf("SC_CLK_TCK")
        self.started = False

    def sample(self):
        seen = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            st = _proc_stat(pid)
            if st is None:
                continue
            comm, pgrp, ticks = st
            if pgrp in self.groups:
                key = self.groups[pgrp]
            elif comm.startswith("postgres"):
                if f" {self.db_name} " not in _cmdline(pid) + " ":
                    continue
                key = "postgres"
            elif comm.startswith("redis-server"):
                key = "redis"
            else:
                continue
            seen[pid] = (key, ticks)
        for pid, v in seen.items():
            if pid not in self.first:
                # a process born after the first sample counts from zero
                self.first[pid] = (v[0], v[1] if not self.started else 0)
            self.last[pid] = v
        self.started = True

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, (key, ticks) in self.last.items():
            out[key] = out.get(key, 0.0) + (ticks - self.first[pid][1]) / self.hz
        return out


class PgActivity:
    """What the database's backends are doing, sampled with the CPU (pg_stat_activity of our
    database): mean number of backends per state and wait event over the samples."""

    def __init__(self, url: str, db_name: str):
        self.url, self.db_name = url, db_name
        self.conn = None
        self.counts: dict[str, float] = {}
        self.queries: dict[str, int] = {}  # what the holder of a waited-for lock is doing
        self.samples = 0

    def sample(self):
        import psycopg

        try:
            if self.conn is None:
                self.conn = psycopg.connect(**pg_conninfo(self.url), autocommit=True)
            rows = self.conn.execute(
                "SELECT pid, state, wait_event_type, wait_event, left(regexp_replace(query, '\\s+', ' ', 'g'), 1024), "
                "pg_blocking_pids(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
                "AND backend_type = 'client backend'", [self.db_name]).fetchall()
        except psycopg.Error:
            self.conn = None
            return
        self.samples += 1
        by_pid = {r[0]: r for r in rows}
        for pid, state, wtype, wevent, query, blockers in rows:
            if state == "active":
                key = f"active, waiting on {wtype}:{wevent}" if wtype else "active, running"
            else:
                key = state or "?"
                if state == "idle":
                    continue
            self.counts[key] = self.counts.get(key, 0) + 1
            if wtype == "Lock" and blockers:
                # follow the chain to the backend that holds the lock and is not itself waiting
                head, seen = blockers[0], set()
                while head in by_pid and by_pid[head][2] == "Lock" and by_pid[head][5] and head not in seen:
                    seen.add(head)
                    head = by_pid[head][5][0]
                h = by_pid.get(head)
                what = "gone" if h is None else (
                    f"{h[1]}{', waiting on ' + h[2] + ':' + h[3] if h[1] == 'active' and h[2] else ''} "
                    f"after/in {_statement_kind(h[4])}")
                self.queries[what] = self.queries.get(what, 0) + 1

    def means(self) -> dict[str, float]:
        return {k: v / self.samples for k, v in sorted(self.counts.items(), key=lambda kv: -kv[1])} \
            if self.samples else {}

    def top_queries(self, n: int = 8) -> list[str]:
        """For the backends waiting on a lock: what the backend holding it is doing (its state
        and its last or current statement), as the mean number of waiters per sample."""
        out = sorted(self.queries.items(), key=lambda kv: -kv[1])[:n]
        return [f"lock waiters whose lock holder is {k}: {v / self.samples:.2f}" for k, v in out] \
            if self.samples else []

    def close(self):
        if self.conn is not None:
            self.conn.close()


def _statement_kind(query: str) -> str:
    """A short, stable name for a statement: its verb and the first table it names."""
    import re

    q = (query or "").strip()
    verb = q.split(" ", 1)[0].upper() if q else "?"
    if verb == "WITH" and "INSERT INTO" in q:
        return "WITH (admit's insert + updates)"
    if verb in ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE"):
        return verb
    m = re.search(r'(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', q, flags=re.I)
    lock = " FOR UPDATE" if "FOR UPDATE" in q.upper() else ""
    return f"{verb} {m.group(1) if m else '?'}{lock}".strip()


# --------------------------------------------------------------------------- clients


def _client_thread(port, tokens, client, take, out, counter, retry_for, t_origin):
    token = tokens[client % len(tokens)]
    analyst = client % len(tokens)
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json", "Host": "127.0.0.1"}
    conn = None
    while True:
        k = take()
        if k is None:
            break
        body = json.dumps({"dataset": DATASET, "engine": "aggregates", "kind": "count",
                           "params": {"epsilon": epsilon_of(k)}})
        t_first = time.monotonic()
        attempts = refused_conn = ambiguous = 0
        status, rtt, rid, code, scope, err = -1, float("nan"), "", "", "", ""
        wait = 0.02
        while True:
            attempts += 1
            sent = False
            t0 = time.monotonic()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=180)
                conn.request("POST", "/api/requests/", body=body, headers=headers)
                sent = True
                resp = conn.getresponse()
                raw = resp.read()
                rtt = time.monotonic() - t0
                status = resp.status
                if resp.will_close:
                    conn.close()
                    conn = None
                break
            except (http.client.HTTPException, OSError) as e:
                if conn is not None:
                    conn.close()
                conn = None
                if isinstance(e, ConnectionRefusedError) or not sent and isinstance(e, (ConnectionError,)):
                    refused_conn += 1  # nothing reached the server
                else:
                    ambiguous += 1  # the request may have been received (the server closed the connection)
                err = type(e).__name__
                if time.monotonic() - t_first > retry_for:
                    break
                time.sleep(wait)
                wait = min(1.0, wait * 2)
        total = time.monotonic() - t_first
        if status > 0:
            try:
                data = json.loads(raw)
            except ValueError:
                data = {}
            if status in (200, 202):
                rid = str(data.get("id", ""))
            else:
                code = str(data.get("code", "")) if isinstance(data, dict) else ""
                scope = str(data.get("scope", "")) if isinstance(data, dict) else ""
                if status >= 500:
                    err = raw[:300].decode(errors="replace")
        out.append((k, analyst, status, rtt, t_first - t_origin, total, attempts, refused_conn, ambiguous, rid,
                    code, scope, err))
        with counter.get_lock():
            counter.value += 1
    if conn is not None:
        conn.close()


def _client_proc(port, tokens, clients, ks, counter, retry_for, t_origin, queue):
    it = iter(ks)
    lock = threading.Lock()

    def take():
        with lock:
            return next(it, None)

    out: list = []
    threads = [threading.Thread(target=_client_thread, args=(port, tokens, c, take, out, counter, retry_for, t_origin),
                                daemon=True) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queue.put(out)


# --------------------------------------------------------------------------- processes


class Service:
    """A process of the image (deploy/entrypoint.sh ROLE) in its own session, output to a file."""

    def __init__(self, role: str, env: dict, logfile: Path):
        self.role, self.env, self.logfile = role, env, logfile
        self.proc = None
        self.f = None

    def start(self):
        self.f = open(self.logfile, "a")
        self.proc = subprocess.Popen([str(REPO / "deploy" / "entrypoint.sh"), self.role], cwd=REPO, env=self.env,
                                     stdout=self.f, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    @property
    def pgid(self) -> int:
        return os.getpgid(self.proc.pid)

    def stop(self, timeout: float = 60) -> float:
        """SIGTERM to the main process, as ``docker stop`` does; SIGKILL to the group after
        ``timeout``. Returns the seconds it took to exit."""
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log(f"{self.role} did not stop within {timeout:.0f}s: SIGKILL")
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        took = time.monotonic() - t0
        # any child left in the group (none expected after a clean exit)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.f.close()
        return took

    def tail(self, n=3000) -> str:
        try:
            return self.logfile.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def wait_http(port: int, token: str, timeout: float = 120, proc: Service | None = None) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc is not None and proc.proc.poll() is not None:
            raise RuntimeError(f"{proc.role} exited {proc.proc.returncode}:\n{proc.tail()}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/api/me/", headers={"Authorization": f"Token {token}", "Host": "127.0.0.1"})
            if c.getresponse().status == 200:
                c.close()
                return time.monotonic() - t0
            c.close()
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the server did not answer on port {port} within {timeout:.0f}s")


# --------------------------------------------------------------------------- setup


def setup_django(args, tmp: Path, db_url: str, redis_url: str) -> dict:
    env = {
        "DJANGO_SETTINGS_MODULE": "governance.settings",
        "DATABASE_URL": db_url,
        "REDIS_URL": redis_url,
        "DATA_DIR": str(tmp / "data"),
        "DATASET_IMPORT_DIRS": str(tmp / "import"),
        "RESULTS_DIR": str(tmp / "results"),
        "GOVERNANCE_VAR_DIR": str(tmp / "var"),
        "MPLCONFIGDIR": str(tmp / "mpl"),
        "DEBUG": "false",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "CELERY_TASK_ALWAYS_EAGER": "false",
        "LOG_LEVEL": "WARNING",
        "PRIVACY_ENGINES_DISABLE_ENTRYPOINTS": "1",
        # the per-analyst rate limit on request creation (settings default 600/min) would
        # turn a load test into a throttling test: off unless --rate-limit is given
        "REQUEST_RATE_LIMIT": args.rate_limit,
        # and the cap on one analyst's queued requests (default 100) would turn it into a
        # 429 test once the clients outrun the workers: off unless --max-active is given
        "MAX_ACTIVE_REQUESTS": str(args.max_active),
    }
    for d in ("data", "import", "var", "results", "mpl"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    for k in ("DATABASE_URL_FILE", "SECRET_KEY_FILE", "CELERY_BROKER_URL"):
        os.environ.pop(k, None)
    os.environ.update(env)
    sys.path.insert(0, str(REPO))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    return env


def make_principals(args, tmp: Path) -> dict:
    """The dataset (budget sized from the planned event), analysts, tokens, grants."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from governance.datasets import registry as datasets
    from governance.ledger import actions as ledger
    from governance.requests import submission
    from accounting import ACCOUNTANTS
    from accounting.costs import price
    from governance.models import Dataset
    from governance.ledger import grants

    User = get_user_model()
    officer = User.objects.create_user("olivia", is_staff=True)
    csv = tmp / "import" / "clinic.csv"
    write_csv(csv)
    schema = {"age": {"lower": 18, "upper": 90}, "income": {"lower": 0, "upper": 200_000}}
    ds = datasets.register(name=DATASET, created_by=officer, path=str(csv), budget_epsilon=1.0,
                           budget_delta=BUDGET_DELTA, policy="rdp", schema=schema, activate=True)
    plan = submission.plan_request(ds, "aggregates", "count", {"epsilon": epsilon_of(args.requests // 2)})
    event = plan.event
    cost = price(ledger.to_event(event)).cost  # what the gate charges for it (a Laplace count: no delta)
    rdp = ACCOUNTANTS["rdp"]
    fit = max(1, int(args.requests * args.admit_fraction))
    budget = rdp.filter_epsilon(cost.times(fit), BUDGET_DELTA)
    ds = datasets.update(ds, budget_epsilon=budget, actor=officer.username)  # a settings record, as an officer
    share = args.requests / args.analysts
    cap_fit = max(1, int(share * args.cap_fraction))
    cap = rdp.filter_epsilon(cost.times(cap_fit), BUDGET_DELTA)
    analysts, tokens, caps = [], [], {}
    for i in range(args.analysts):
        u = User.objects.create_user(f"analyst{i:02d}")
        tokens.append(Token.objects.create(user=u).key)
        capped = i < args.capped
        g = grants.give(u, ds, officer, cap_epsilon=cap if capped else None)
        analysts.append(u)
        caps[g.pk] = cap if capped else None
    gate_ds = datasets.register(name="gate", created_by=officer, path=str(csv), budget_epsilon=1e6,
                                budget_delta=BUDGET_DELTA, policy="rdp", schema=schema, activate=True)
    grants.give(analysts[-1], gate_ds, officer)
    from django.db import connections

    connections.close_all()
    return {"ds_pk": ds.pk, "gate_pk": gate_ds.pk, "event": event, "budget": budget, "fit": fit, "cap": cap,
            "cap_fit": cap_fit, "tokens": tokens, "analysts": [a.pk for a in analysts], "caps": caps,
            "officer": officer.pk, "csv_rows": 200}


# --------------------------------------------------------------------------- profile


def pyspy(pids: list[int], seconds: float, out: Path) -> list[subprocess.Popen]:
    exe = Path(PY).parent / "py-spy"
    if not exe.exists():
        log("py-spy not installed: no profile")
        return []
    return [subprocess.Popen([str(exe), "record", "--pid", str(p), "--duration", str(int(seconds)), "--rate", "100",
                              "--format", "raw", "--nonblocking", "--output", str(out / f"pyspy-{p}.txt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            for p in pids]  # own session: its CPU is not counted as the clients'


def _frame_key(fr: str) -> str:
    if " (" not in fr:
        return fr
    name, where = fr.split(" (", 1)
    where = where.split(":")[0].split("/site-packages/")[-1].split(str(REPO) + "/")[-1]
    return f"{name} ({where})"


def summarize_pyspy(files: list[Path], label: str, top: int = 14) -> list[str]:
    """Share of samples (inclusive) of the busiest frames of this repository and of the
    leaf frames; idle samples (a thread waiting in select/poll/accept/sleep) are left out."""
    idle_leaf = ("select (selectors.py)", "poll (selectors.py)", "wait (threading.py)", "accept (socket.py)",
                 "sleep (", "_wait_for_tstate_lock", "get (queue.py)", "_recv (", "epoll")
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
            frames = stack.split(";")
            lk = _frame_key(frames[-1])
            if any(s in lk for s in idle_leaf) or "(threading.py)" in lk and "wait" in lk:
                continue
            n = int(n)
            total += n
            for key in {_frame_key(fr) for fr in frames}:
                incl[key] = incl.get(key, 0) + n
            leaf[lk] = leaf.get(lk, 0) + n
    if not total:
        return [f"py-spy {label}: no busy samples"]
    lines = [f"py-spy {label}: {total} busy samples; inclusive share of the busiest frames:"]
    wanted = ("(governance/", "(engines/", "(workers/", "(rest_framework/", "(django/core/handlers",
              "(django/db/backends", "(psycopg/", "(gunicorn/", "(celery/", "(kombu/", "(json/", "(orjson")
    ours = [(k, v) for k, v in incl.items() if any(s in k for s in wanted)]
    for k, v in sorted(ours, key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {100 * v / total:5.1f}%  {k}")
    lines.append("  top self (leaf) frames:")
    for k, v in sorted(leaf.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {100 * v / total:5.1f}%  {k}")
    return lines


# --------------------------------------------------------------------------- the run


def drive(args, port, tokens, services: dict, meter: CpuMeter, prof_dir: Path, pg_activity=None) -> dict:
    """Run the clients; restart the web server at --fault-at (``services["web"]`` is then the
    new one); returns the records and the faults."""
    web = services["web"]
    ctx = mp.get_context("fork")
    nproc = min(args.client_procs, args.clients)
    counter = ctx.Value("q", 0)
    clients = list(range(args.clients))
    q = ctx.Queue()
    t_origin = time.monotonic()
    procs = []
    for p in range(nproc):
        ks = list(range(p, args.requests, nproc))
        procs.append(ctx.Process(target=_client_proc, args=(port, tokens, clients[p::nproc], ks, counter,
                                                             args.retry_for, t_origin, q), daemon=True))
    for p in procs:
        p.start()
    faults = []
    fault_at = None if args.no_fault else max(1, int(args.requests * args.fault_at))
    prof_at = int(args.requests * 0.3) if args.profile else None
    prof_procs, prof_pids = [], {}
    last_log = last_sample = time.monotonic()
    progress = []  # (t, done)
    results: list = []
    got = 0
    while got < nproc:
        try:
            results.extend(q.get(timeout=0.5))
            got += 1
            continue
        except Exception:  # noqa: BLE001 - queue.Empty
            pass
        now = time.monotonic()
        done = counter.value
        if pg_activity is not None:
            pg_activity.sample()
        if now - last_sample >= 2.0:
            meter.sample()
            last_sample = now
            progress.append((now - t_origin, done))
        if now - last_log >= args.log_every:
            last_log = now
            rate = done / (now - t_origin)
            log(f"  {done:,}/{args.requests:,} answered ({rate:.1f}/s), load {os.getloadavg()[0]:.2f}")
        if prof_at is not None and not prof_procs and done >= prof_at:
            wpids = _children(web.proc.pid)
            cpids = _children(services["worker"].proc.pid)
            prof_pids = {"web": wpids, "worker": cpids}
            prof_procs = pyspy(wpids + cpids, args.profile_seconds, prof_dir)
            log(f"  py-spy on gunicorn workers {wpids} and Celery processes {cpids} for {args.profile_seconds:.0f}s")
        if fault_at is not None and not faults and done >= fault_at:
            for p in prof_procs:  # a profile must not straddle the restart
                p.wait()
            meter.sample()
            t0 = time.monotonic()
            took_stop = web.stop()
            web = services["web"] = Service("web", web.env, web.logfile).start()
            meter.groups[web.pgid] = "web"
            up = wait_http(port, tokens[0], proc=web)
            t_up = time.monotonic()
            faults.append({"kind": "web restart (SIGTERM to gunicorn's master, graceful, then started again)",
                           "at_request": done, "stop_s": round(took_stop, 2), "start_s": round(up, 2),
                           "unavailable_s": round(t_up - t0, 2), "t": round(t0 - t_origin, 2)})
            log(f"  fault: web restarted at {done:,} answered: stop {took_stop:.1f}s, start {up:.1f}s")
    for p in procs:
        p.join(30)
    for p in prof_procs:
        p.wait()
    meter.sample()
    t_end = time.monotonic()
    return {"records": results, "faults": faults, "wall": t_end - t_origin, "progress": progress,
            "profile_pids": prof_pids}


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def drain(ds_pk: int, timeout: float) -> tuple[float, int]:
    """Wait until no request of the dataset is queued or running; (seconds, left)."""
    from django.db import close_old_connections

    from governance.models import Request

    t0 = time.monotonic()
    last = time.monotonic()
    while True:
        left = Request.objects.filter(dataset_id=ds_pk, status__in=["queued", "running"]).count()
        if left == 0 or time.monotonic() - t0 > timeout:
            return time.monotonic() - t0, left
        if time.monotonic() - last > 15:
            last = time.monotonic()
            log(f"  draining: {left:,} queued or running")
        time.sleep(0.5)
        close_old_connections()


def reliability(args, setup: dict, records: list, env: dict) -> dict:
    """The checks, from the database (and the clients' answers)."""
    from django.db.models import Count

    from governance.ledger import actions as ledger
    from accounting import ACCOUNTANTS
    from accounting.costs import Cost
    from governance.models import AuditRecord, Budget, Dataset, Grant, LedgerEntry, Request

    ds_pk = setup["ds_pk"]
    ds = Dataset.objects.get(pk=ds_pk)
    acc = ACCOUNTANTS[ds.policy]
    by_status: dict[int, int] = {}
    for r in records:
        by_status[r[2]] = by_status.get(r[2], 0) + 1
    answered = [r for r in records if r[2] > 0]
    admitted = {r[9]: r for r in records if r[2] == 202}
    replayed = [r for r in records if r[2] == 200]
    refused = [r for r in records if r[2] == 409 and r[10] == "budget.exceeded"]
    refused_scope = {}
    for r in refused:
        refused_scope[r[11]] = refused_scope.get(r[11], 0) + 1
    other_409 = [r for r in records if r[2] == 409 and r[10] != "budget.exceeded"]
    throttled = [r for r in records if r[2] == 429]
    other_4xx = [r for r in records if 400 <= r[2] < 500 and r[2] not in (409, 429)]
    five = [r for r in records if r[2] >= 500]
    no_answer = [r for r in records if r[2] <= 0]
    ambiguous_ks = {r[0] for r in records if r[8] > 0}
    ks_client = [r[0] for r in records]

    rows = list(Request.objects.filter(dataset_id=ds_pk).values_list("id", "status", "params", "ledger_entry_id",
                                                                     "replay_of_id", "error"))
    db_by_id = {str(r[0]): r for r in rows}
    db_ks: dict[int, list] = {}
    for r in rows:
        db_ks.setdefault(k_of(float(r[2]["epsilon"])), []).append(r)
    status_counts = {}
    for r in rows:
        status_counts[r[1]] = status_counts.get(r[1], 0) + 1
    failures = {}
    for r in rows:
        if r[1] == "failed":
            c = (r[5] or {}).get("code", "?")
            failures[c] = failures.get(c, 0) + 1
    missing = [rid for rid in admitted if rid not in db_by_id]
    not_final = [rid for rid, _ in admitted.items() if rid in db_by_id and db_by_id[rid][1] not in FINAL]
    all_not_final = [r for r in rows if r[1] not in FINAL]
    told = set(admitted) | {r[9] for r in replayed}
    unreported = [r for r in rows if str(r[0]) not in told]
    unreported_unexplained = [r for r in unreported if k_of(float(r[2]["epsilon"])) not in ambiguous_ks]
    duplicate_ks = {k: v for k, v in db_ks.items() if len(v) > 1}
    duplicate_unexplained = {k: v for k, v in duplicate_ks.items() if k not in ambiguous_ks}
    wrong_k = [rid for rid, r in admitted.items() if rid in db_by_id
               and k_of(float(db_by_id[rid][2]["epsilon"])) != r[0]]
    lost = len(missing) + len(not_final) + len(no_answer)

    entries = dict(LedgerEntry.objects.filter(dataset_id=ds_pk).values_list("status").annotate(n=Count("id")))
    entry_ids = [r[3] for r in rows if r[4] is None]
    # spend recomputed from the ledger, per dataset and per grant, under the gating filter
    state = ledger.recompute_state(ds_pk)
    budget_row = Budget.objects.get(pk=ds_pk)
    running = Cost.from_json(budget_row.state)
    committed_row = Cost.from_json(budget_row.committed)
    spent = acc.filter_epsilon(state, ds.budget_delta)
    overspent = []
    if spent > ds.budget_epsilon:
        overspent.append(f"dataset: {spent!r} > {ds.budget_epsilon!r}")
    grants = []
    for g in Grant.objects.filter(dataset_id=ds_pk):
        gstate = Cost.zero()
        for cost, ccost in LedgerEntry.objects.filter(grant_id=g.pk).exclude(status="released").values_list(
                "cost", "committed_cost"):
            gstate = gstate + Cost.from_json(ccost or cost)
        lim = ledger.Limit.of_grant(g, ds) or ledger.Limit.of_dataset(ds)
        gspent = lim.spent(gstate)
        row_spent = lim.spent(Cost.from_json(g.state))
        grants.append({"grant": g.pk, "cap": g.cap_epsilon, "spent": gspent, "limit": lim.epsilon,
                       "row_agrees": math.isclose(gspent, row_spent, rel_tol=1e-9, abs_tol=1e-12),
                       "entries": LedgerEntry.objects.filter(grant_id=g.pk).exclude(status="released").count()})
        if gspent > lim.epsilon:
            overspent.append(f"grant {g.pk}: {gspent!r} > {lim.epsilon!r}")
    running_agrees = math.isclose(acc.filter_epsilon(running, ds.budget_delta), spent, rel_tol=1e-9, abs_tol=1e-12) \
        and math.isclose(running.eps, state.eps, rel_tol=1e-9, abs_tol=1e-12)
    committed_agrees = math.isclose(committed_row.eps, state.eps, rel_tol=1e-9, abs_tol=1e-12)

    audit = dict(AuditRecord.objects.filter(dataset_id=ds_pk).values_list("action").annotate(n=Count("id")))
    chain = AuditRecord.objects.filter(dataset_id=ds_pk).count()
    refuse_ks = set()
    for params in AuditRecord.objects.filter(dataset_id=ds_pk, action="refuse").values_list("params", flat=True):
        refuse_ks.add(k_of(float(params["epsilon"])))
    refused_not_audited = [r[0] for r in refused if r[0] not in refuse_ks]
    committed, released = entries.get("committed", 0), entries.get("released", 0)
    reserved = entries.get("reserved", 0)
    t0 = time.monotonic()
    verify = subprocess.run([PY, "manage.py", "audit", "verify", "--dataset", DATASET], cwd=REPO,
                            env={**os.environ, **env}, capture_output=True, text=True)
    verify_s = time.monotonic() - t0
    ks_answered = {r[0] for r in answered}
    checks = {
        "attempted": len(records),
        "every k sent once": sorted(ks_client) == list(range(args.requests)),
        "admitted (202)": len(admitted),
        "replayed (200)": len(replayed),
        "refused (409 budget.exceeded)": len(refused),
        "refused by scope": refused_scope,
        "other 409": len(other_409),
        "throttled (429)": len(throttled),
        "other 4xx": len(other_4xx),
        "5xx": len(five),
        "no answer": len(no_answer),
        "connection errors retried (refused / ambiguous)": [sum(r[7] for r in records), sum(r[8] for r in records)],
        "requests answered after a retry": sum(1 for r in records if r[6] > 1 and r[2] > 0),
        "lost": lost,
        "lost detail (202 missing in db / 202 not final / never answered)": [len(missing), len(not_final),
                                                                           len(no_answer)],
        "db requests": len(rows),
        "db requests by status": status_counts,
        "db failures by code": failures,
        "db requests not final": len(all_not_final),
        "db requests no client was told about (all / not after an ambiguous error)": [len(unreported),
                                                                                     len(unreported_unexplained)],
        "ks admitted twice (all / not after an ambiguous error)": [len(duplicate_ks), len(duplicate_unexplained)],
        "202 ids whose stored k differs": len(wrong_k),
        "ledger entries by status": entries,
        "one ledger entry per request": None not in entry_ids and len(set(entry_ids)) == len(entry_ids)
        and len(entry_ids) == sum(entries.values()),
        "left reserved": reserved,
        "dataset budget epsilon": ds.budget_epsilon,
        "dataset spent (recomputed, gating filter)": spent,
        "dataset remaining": ds.budget_epsilon - spent,
        "overspent": len(overspent),
        "overspent detail": overspent,
        "grants capped / spent max fraction of cap": [sum(1 for g in grants if g["cap"] is not None),
                                                      max([g["spent"] / g["limit"] for g in grants
                                                           if g["cap"] is not None] or [0])],
        "grant rows agree with the ledger": all(g["row_agrees"] for g in grants),
        "budget running state == recompute": running_agrees,
        "budget committed totals == recompute": committed_agrees,
        "audit records by action": audit,
        "audit chain length": chain,
        "audit chain == commit + release + refuse + replay records": chain == sum(audit.values())
        and chain == budget_row.audit_seq,
        "audit commit == committed entries": audit.get("commit", 0) == committed,
        "audit release == released entries": audit.get("release", 0) == released,
        "audit refuse == refusals answered (+ ambiguous)": audit.get("refuse", 0) - len(refused),
        "refusals without a refuse record": len(refused_not_audited),
        "audit verify exit": verify.returncode,
        "audit verify s": round(verify_s, 1),
        "audit verify output": (verify.stdout + verify.stderr).strip()[-400:],
        "ks never answered": args.requests - len(ks_answered),
    }
    if five:
        checks["first 5xx"] = five[0][12]
    if other_4xx:
        checks["first other 4xx"] = [other_4xx[0][2], other_4xx[0][10]]
    ok = (lost == 0 and not overspent and not five and reserved == 0 and verify.returncode == 0
          and checks["every k sent once"] and not unreported_unexplained and not duplicate_unexplained
          and not wrong_k and checks["one ledger entry per request"] and running_agrees and committed_agrees
          and checks["grant rows agree with the ledger"] and checks["audit chain == commit + release + refuse + replay records"]
          and checks["audit commit == committed entries"] and checks["audit release == released entries"]
          and not refused_not_audited and not other_4xx and not other_409 and not all_not_final)
    checks["ok"] = bool(ok)
    return checks


def gate_in_process(setup: dict, n: int) -> dict:
    """One client in this process, server and workers stopped: ``ledger.admit`` of the same
    planned event, and ``submission.submit`` of the same kind of request (plan, request row,
    gate, Celery message to Redis on commit), on the "gate" dataset of the same database.
    With no worker to end them, the requests pile up: the active-request cap is off here
    as on the server (--max-active)."""
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from governance.ledger import actions as ledger
    from governance.requests import submission
    from governance.models import Dataset

    ds = Dataset.objects.get(pk=setup["gate_pk"])
    analyst = get_user_model().objects.get(pk=setup["analysts"][-1])
    event = setup["event"]
    perf = time.perf_counter
    settings.MAX_ACTIVE_REQUESTS = 0

    def admit_loop(m):
        ts = []
        t0 = perf()
        for _ in range(m):
            a = perf()
            ledger.admit(ds.pk, analyst, event)
            ts.append(perf() - a)
        return ts, perf() - t0

    def submit_loop(m, base):
        ts = []
        t0 = perf()
        for i in range(m):
            a = perf()
            submission.submit(analyst, ds, "aggregates", "count", {"epsilon": epsilon_of(base + i)})
            ts.append(perf() - a)
        return ts, perf() - t0

    admit_loop(min(100, n))
    submit_loop(min(50, n), 10**8)
    adm, adm_wall = admit_loop(n)
    sub, sub_wall = submit_loop(n, 2 * 10**8)
    return {"n": n, "admit_per_s": n / adm_wall, "admit_p50": quantile(adm, .5), "admit_p99": quantile(adm, .99),
            "submit_per_s": n / sub_wall, "submit_p50": quantile(sub, .5), "submit_p99": quantile(sub, .99)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=100_000, help="POSTs in all (100000)")
    ap.add_argument("--clients", type=int, default=64, help="concurrent clients (64)")
    ap.add_argument("--quick", action="store_true", help="CI size: 1,000 POSTs, 64 clients, gate comparison n=200")
    ap.add_argument("--analysts", type=int, default=16, help="analysts (16); client c is analyst c mod A")
    ap.add_argument("--capped", type=int, default=4, help="analysts with a cap (4)")
    ap.add_argument("--cap-fraction", type=float, default=0.25,
                    help="a capped analyst's cap fits this fraction of its share of the requests (0.25)")
    ap.add_argument("--admit-fraction", type=float, default=0.5,
                    help="the dataset budget fits this fraction of the requests (0.5)")
    ap.add_argument("--gunicorn-workers", type=int, default=2, help="GUNICORN_WORKERS (2, the entrypoint's default)")
    ap.add_argument("--threads", type=int, default=4, help="GUNICORN_THREADS (4, the entrypoint's default)")
    ap.add_argument("--celery", type=int, default=2, help="WORKER_CONCURRENCY, prefork processes (2)")
    ap.add_argument("--client-procs", type=int, default=4, help="client processes the threads are spread over (4)")
    ap.add_argument("--rate-limit", default="", help="REQUEST_RATE_LIMIT for the server ('' = none, the default here)")
    ap.add_argument("--max-active", type=int, default=0,
                    help="MAX_ACTIVE_REQUESTS for the server (0 = no cap, the default here)")
    ap.add_argument("--no-fault", action="store_true", help="do not restart the web server during the run")
    ap.add_argument("--fault-at", type=float, default=0.5, help="restart the web server at this fraction (0.5)")
    ap.add_argument("--retry-for", type=float, default=120.0, help="a client retries a connection error this long")
    ap.add_argument("--drain-timeout", type=float, default=3600.0, help="seconds to wait for the workers (3600)")
    ap.add_argument("--gate-n", type=int, default=2000, help="in-process admissions for the comparison (2000)")
    ap.add_argument("--profile", action="store_true", help="py-spy the server and workers at 30%% of the run")
    ap.add_argument("--profile-seconds", type=float, default=30.0)
    ap.add_argument("--db", default="governance_load", help="scratch database (dropped and recreated)")
    ap.add_argument("--redis-db", type=int, default=13)
    ap.add_argument("--log-every", type=float, default=15.0)
    ap.add_argument("--keep", action="store_true", help="keep the temp dir, logs and database")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.gate_n = 1000, 200
        args.drain_timeout = min(args.drain_timeout, 300.0)
        args.log_every = 5.0
    if args.capped > args.analysts:
        ap.error("--capped must not exceed --analysts")

    t_start = time.monotonic()
    load0 = os.getloadavg()
    code = git_code()  # what the processes start with (a web restart loads the tree of that moment)
    base = pg_base_url()
    ensure_services(base)
    import redis

    redis_url = f"redis://127.0.0.1:{REDIS_PORT}/{args.redis_db}"
    redis.Redis.from_url(redis_url).flushdb()
    tmp = Path(tempfile.mkdtemp(prefix="bench-load-"))
    services = {}
    ok = False
    try:
        db_url, where = create_database(base, args.db)
        env = setup_django(args, tmp, db_url, redis_url)
        t_setup = time.monotonic()
        setup = make_principals(args, tmp)
        log(f"dataset {DATASET}: budget epsilon {setup['budget']:.6g} (rdp filter of {setup['fit']:,} planned "
            f"events {json.dumps(setup['event'])}); {args.capped} of {args.analysts} analysts capped at "
            f"{setup['cap']:.6g} ({setup['cap_fit']:,} events)")
        port = free_port()
        proc_env = {**os.environ, **env, "PATH": f"{Path(PY).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                    "PORT": str(port), "GUNICORN_WORKERS": str(args.gunicorn_workers),
                    "GUNICORN_THREADS": str(args.threads), "MIGRATE_ON_START": "false",
                    "GUNICORN_WORKER_TMP_DIR": "/dev/shm" if os.path.isdir("/dev/shm") else str(tmp),
                    "WORKER_QUEUES": "cpu,gpu", "WORKER_CONCURRENCY": str(args.celery), "WORKER_POOL": "prefork",
                    "WORKER_LOGLEVEL": "WARNING",
                    # the workers' ticks (docs/privacy.md, side channels) only pace the drain, not admission
                    "RELEASE_QUANTUM_MS": os.environ.get("RELEASE_QUANTUM_MS", "0")}
        proc_env.pop("DJANGO_SETTINGS_MODULE", None)
        worker = services["worker"] = Service("worker", proc_env, tmp / "worker.log").start()
        web = services["web"] = Service("web", proc_env, tmp / "web.log").start()
        up_s = wait_http(port, setup["tokens"][0], proc=web)
        log(f"web (deploy/entrypoint.sh web) answering on 127.0.0.1:{port} after {up_s:.1f}s; "
            f"{args.clients} clients, {args.requests:,} POSTs; workers' RELEASE_QUANTUM_MS {proc_env['RELEASE_QUANTUM_MS']}")
        meter = CpuMeter(args.db)
        meter.groups = {web.pgid: "web", worker.pgid: "worker", os.getpgid(0): "clients"}
        meter.sample()
        activity = PgActivity(db_url, args.db)
        run = drive(args, port, setup["tokens"], services, meter, tmp, activity)
        activity.close()
        web = services["web"]
        records = run["records"]
        cpu = meter.totals()
        log(f"clients done in {run['wall']:.1f}s; waiting for the workers")
        drain_s, left = drain(setup["ds_pk"], args.drain_timeout)
        meter.sample()
        cpu_all = meter.totals()
        load1 = os.getloadavg()
        from django.db import connections

        from governance.models import Request

        times = Request.objects.filter(dataset_id=setup["ds_pk"]).exclude(finished_at=None).values_list(
            "created_at", "started_at", "finished_at")
        created = [t[0] for t in times]
        finished = [t[2] for t in times]
        queue_s = [(t[1] - t[0]).total_seconds() for t in times if t[1]]
        run_s = [(t[2] - t[1]).total_seconds() for t in times if t[1]]
        completed_span = (max(finished) - min(created)).total_seconds() if times else float("nan")
        log("checks")
        checks = reliability(args, setup, records, env)
        web_log_5xx = sum(1 for line in (tmp / "web.log").read_text(errors="replace").splitlines()
                          if '" 5' in line and "HTTP/1.1" in line)
        web_errors = [line for line in (tmp / "web.log").read_text(errors="replace").splitlines()
                      if "Traceback" in line or "[ERROR]" in line or "[CRITICAL]" in line]
        worker_errors = [line for line in (tmp / "worker.log").read_text(errors="replace").splitlines()
                         if "Traceback" in line or "ERROR" in line or "CRITICAL" in line]
        # ------------------------------------------------------------ the gate in this process
        log("stopping the server and workers; the gate in this process")
        web.stop()
        worker.stop()
        connections.close_all()
        gate = gate_in_process(setup, args.gate_n) if args.gate_n else None
        connections.close_all()

        # ------------------------------------------------------------ report
        answered = [r for r in records if r[2] > 0]
        post = [r[3] for r in answered]
        post_adm = [r[3] for r in answered if r[2] == 202]
        post_ref = [r[3] for r in answered if r[2] == 409]
        total = [r[5] for r in answered]
        wall = run["wall"]
        t_last_admit = max([r[4] + r[5] for r in records if r[2] == 202] or [float("nan")])
        n_adm = checks["admitted (202)"]
        adm_rate = n_adm / t_last_admit if t_last_admit == t_last_admit else float("nan")
        print(f"== Load: {args.requests:,} admissions by {args.clients} clients on one dataset, REST + gunicorn + "
              f"Celery + Redis + PostgreSQL; code at git {code} (at the start)")
        print(f"   {where}; Redis db {args.redis_db}")
        print(f"   web: deploy/entrypoint.sh web = gunicorn governance.wsgi gthread {args.gunicorn_workers} workers x "
              f"{args.threads} threads (timeout 120, keep-alive 5, max-requests "
              f"{os.environ.get('GUNICORN_MAX_REQUESTS', '20000')} +- "
              f"{os.environ.get('GUNICORN_MAX_REQUESTS_JITTER', '2000')}), DEBUG=false; worker: "
              f"deploy/entrypoint.sh worker = manage.py worker -Q cpu,gpu -c {args.celery} (prefork); "
              f"REQUEST_RATE_LIMIT {args.rate_limit or 'off'}; MAX_ACTIVE_REQUESTS {args.max_active or 'off'}; DB_CONN_MAX_AGE {os.environ.get('DB_CONN_MAX_AGE', '60 (default)')}")
        print(f"   dataset {DATASET}: {setup['csv_rows']}-row CSV, rdp policy, delta {BUDGET_DELTA:g}, budget epsilon "
              f"{setup['budget']:.6g} (= the rdp filter of {setup['fit']:,} of the planned events "
              f"{json.dumps(setup['event'])}); {args.analysts} analysts with grants, {args.capped} capped at epsilon "
              f"{setup['cap']:.6g} ({setup['cap_fit']:,} events)")
        print(f"   requests: POST /api/requests/ count, epsilon 0.01*(1+k*1e-9), k = 0..{args.requests - 1} each once; "
              f"{args.clients} closed-loop clients (threads in {min(args.client_procs, args.clients)} processes, one "
              f"keep-alive connection each), no polling; connection errors retried with the same k")
        print(f"   machine: {machine()}, shared with other sessions; 1-min load avg start/end {load0[0]:.2f}/"
              f"{load1[0]:.2f}; run {time.monotonic() - t_start:.0f}s (setup {t_setup - t_start:.0f}s)")
        print()
        print(f"throughput: {len(records) / wall:,.1f} POSTs/s answered ({len(records):,} in {wall:.1f}s); "
              f"{adm_rate:,.1f} admissions/s ({n_adm:,} admitted by {t_last_admit:.1f}s); "
              f"{len(finished) / completed_span:,.1f} completed requests/s ({len(finished):,} finished between the "
              f"first created_at and the last finished_at, {completed_span:.1f}s); drain after the clients "
              f"{drain_s:.1f}s")
        by_time = sorted(records, key=lambda r: r[4] + r[5])
        tenth = max(1, len(by_time) // 10)
        parts = []
        prev_t = 0.0
        for i in range(0, len(by_time) - tenth + 1, tenth):
            chunk = by_time[i:i + tenth]
            t_end_chunk = chunk[-1][4] + chunk[-1][5]
            adm = sum(1 for r in chunk if r[2] == 202)
            p50 = quantile([r[3] for r in chunk if r[2] > 0], .5)
            parts.append(f"{len(chunk) / max(1e-9, t_end_chunk - prev_t):.1f}/s {100 * adm / len(chunk):.0f}% "
                         f"{p50 * 1e3:,.0f}ms")
            prev_t = t_end_chunk
        print("per tenth of the answers (POSTs/s, admitted share, p50 round trip): " + " | ".join(parts))
        print()
        hdr = f"{'POST latency (ms)':<40} {'n':>8} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>9}"
        print(hdr)
        print("-" * len(hdr))
        for label, xs in (("round trip, all answered", post), ("  admitted (202)", post_adm),
                          ("  refused (409)", post_ref), ("client-perceived incl. retries", total)):
            print(f"{label:<40} {len(xs):>8,} {ms(quantile(xs, .5)):>8} {ms(quantile(xs, .9)):>8} "
                  f"{ms(quantile(xs, .99)):>8} {ms(max(xs) if xs else float('nan')):>9}")
        print(f"{'server: created -> started (queue)':<40} {len(queue_s):>8,} {ms(quantile(queue_s, .5)):>8} "
              f"{ms(quantile(queue_s, .9)):>8} {ms(quantile(queue_s, .99)):>8} {ms(max(queue_s) if queue_s else float('nan')):>9}")
        print(f"{'server: started -> finished (worker)':<40} {len(run_s):>8,} {ms(quantile(run_s, .5)):>8} "
              f"{ms(quantile(run_s, .9)):>8} {ms(quantile(run_s, .99)):>8} {ms(max(run_s) if run_s else float('nan')):>9}")
        if gate:
            print()
            print(f"the same gate in this process, one client, server and workers stopped (n = {gate['n']:,}):")
            print(f"  ledger.admit of the planned event: {gate['admit_per_s']:,.0f}/s (p50 {ms(gate['admit_p50'])} ms, "
                  f"p99 {ms(gate['admit_p99'])} ms)")
            print(f"  submission.submit (plan, request row, gate, Celery message on commit): {gate['submit_per_s']:,.0f}/s "
                  f"(p50 {ms(gate['submit_p50'])} ms, p99 {ms(gate['submit_p99'])} ms)")
            print(f"  HTTP with {args.clients} clients / in-process: POSTs/s {len(records) / wall / gate['admit_per_s']:.3f}x "
                  f"ledger.admit, {len(records) / wall / gate['submit_per_s']:.3f}x submit; p50 POST round trip / "
                  f"p50 submit {quantile(post, .5) / gate['submit_p50']:.1f}x")
        print()
        keys = ["web", "worker", "postgres", "redis", "clients"]
        print(f"CPU seconds while the clients ran ({wall:.0f}s; per second of wall, 2.00 = two CPUs busy; "
              f"sampled from /proc every 2 s): " + ", ".join(f"{k} {cpu.get(k, 0) / wall:.2f}" for k in keys)
              + "; per answered POST (ms): " + ", ".join(f"{k} {1e3 * cpu.get(k, 0) / max(1, len(records)):.1f}"
                                                       for k in keys))
        print("PostgreSQL backends of the database while the clients ran (pg_stat_activity every 0.5 s, mean "
              "count; idle ones left out): " + ", ".join(f"{k} {v:.2f}" for k, v in activity.means().items()))
        for line in activity.top_queries():
            print(f"  {line}")
        print(f"CPU seconds until drained ({wall + drain_s:.0f}s), per finished request (ms): worker "
              f"{1e3 * cpu_all.get('worker', 0) / max(1, len(finished)):.1f}")
        print()
        faults = run["faults"]
        print("reliability report (from the database and the clients' answers):")
        c = checks
        rows = [
            ("requests attempted", c["attempted"]),
            ("admitted (202)", c["admitted (202)"]),
            ("refused (409 budget.exceeded)", f"{c['refused (409 budget.exceeded)']:,} "
                                              f"(dataset {c['refused by scope'].get('dataset', 0):,}, "
                                              f"grant cap {c['refused by scope'].get('grant', 0):,})"),
            ("replayed (200)", c["replayed (200)"]),
            ("other 409 / 429 / other 4xx", f"{c['other 409']} / {c['throttled (429)']} / {c['other 4xx']}"),
            ("5xx (must be 0)", c["5xx"]),
            ("5xx in the web server's access log", web_log_5xx),
            ("never answered", c["no answer"]),
            ("connection errors retried: refused / ambiguous", " / ".join(map(str, c["connection errors retried (refused / ambiguous)"]))),
            ("lost (must be 0)", f"{c['lost']} (202 not in db {c['lost detail (202 missing in db / 202 not final / never answered)'][0]}, "
                                 f"202 not final {c['lost detail (202 missing in db / 202 not final / never answered)'][1]}, "
                                 f"never answered {c['no answer']})"),
            ("requests in db / by status", f"{c['db requests']:,} {c['db requests by status']}"),
            ("failed requests by code", c["db failures by code"] or "none"),
            ("db requests no client was told of (all / unexplained)", " / ".join(map(str, c["db requests no client was told about (all / not after an ambiguous error)"]))),
            ("k admitted twice (all / unexplained)", " / ".join(map(str, c["ks admitted twice (all / not after an ambiguous error)"]))),
            ("overspent (must be 0)", f"{c['overspent']} (dataset spent {c['dataset spent (recomputed, gating filter)']:.9g} "
                                      f"of {c['dataset budget epsilon']:.9g}; capped grants at most "
                                      f"{100 * c['grants capped / spent max fraction of cap'][1]:.4f}% of their cap)"),
            ("budget row == recompute (running / committed)", f"{c['budget running state == recompute']} / "
                                                              f"{c['budget committed totals == recompute']}; grant rows: "
                                                              f"{c['grant rows agree with the ledger']}"),
            ("ledger entries by status", c["ledger entries by status"]),
            ("left reserved (must be 0)", c["left reserved"]),
            ("one ledger entry per admitted request", c["one ledger entry per request"]),
            ("audit records by action", c["audit records by action"]),
            ("audit chain length == commit+release+refuse+replay", f"{c['audit chain length']:,}: "
                                                                   f"{c['audit chain == commit + release + refuse + replay records']}"),
            ("commit records == committed; release == released", f"{c['audit commit == committed entries']}; "
                                                                 f"{c['audit release == released entries']}"),
            ("refusals answered without a refuse record", c["refusals without a refuse record"]),
            ("manage.py audit verify --dataset load", f"exit {c['audit verify exit']} ({c['audit verify s']}s): "
                                                       f"{c['audit verify output'].splitlines()[-1] if c['audit verify output'] else ''}"),
            ("faults injected", len(faults)),
            ("faults survived", len(faults) if c["ok"] and not c["no answer"] else 0),
            ("tracebacks / errors in the logs (web / worker)", f"{len(web_errors)} / {len(worker_errors)}"),
        ]
        for label, v in rows:
            print(f"  {label:<52} {v}")
        for f in faults:
            print(f"  fault: {f['kind']} at {f['at_request']:,} answered (t={f['t']}s): stopped in {f['stop_s']}s, "
                  f"answering again {f['start_s']}s later; unavailable {f['unavailable_s']}s")
        if "first 5xx" in c:
            print(f"  first 5xx: {c['first 5xx']}")
        if web_errors:
            print(f"  first web log error: {web_errors[0][:300]}")
        if worker_errors:
            print(f"  first worker log error: {worker_errors[0][:300]}")
        if c["overspent detail"]:
            print(f"  overspent: {c['overspent detail'][:5]}")
        print(f"  => {'OK' if c['ok'] else 'FAILED'}")
        if args.profile and run["profile_pids"]:
            print()
            for role in ("web", "worker"):
                files = [tmp / f"pyspy-{p}.txt" for p in run["profile_pids"][role]]
                for line in summarize_pyspy(files, f"{role} processes ({args.profile_seconds:.0f}s at 30% of the run)"):
                    print(line)
        ok = c["ok"]
        result = {
            "requests": args.requests, "clients": args.clients, "wall_s": wall, "drain_s": drain_s,
            "drain_left": left, "posts_per_s": len(records) / wall, "admissions_per_s": adm_rate,
            "completed_per_s": len(finished) / completed_span if completed_span == completed_span else None,
            "post_ms": {p: quantile(post, q) * 1e3 for p, q in (("p50", .5), ("p90", .9), ("p99", .99), ("max", 1))},
            "attempted": c["attempted"], "admitted": c["admitted (202)"],
            "refused": c["refused (409 budget.exceeded)"], "refused_by_scope": c["refused by scope"],
            "replayed": c["replayed (200)"], "other_4xx": c["other 4xx"] + c["other 409"] + c["throttled (429)"],
            "status_5xx": c["5xx"], "no_answer": c["no answer"], "lost": c["lost"], "overspent": c["overspent"],
            "left_reserved": c["left reserved"], "audit_verify_exit": c["audit verify exit"],
            "audit_chain_ok": c["audit chain == commit + release + refuse + replay records"],
            "faults_injected": len(faults), "faults_survived": len(faults) if ok and not c["no answer"] else 0,
            "gate_admit_per_s": gate["admit_per_s"] if gate else None,
            "gate_submit_per_s": gate["submit_per_s"] if gate else None,
            "load": [load0[0], load1[0]], "ok": ok,
        }
        print(RESULT_TAG + json.dumps(result))
    finally:
        for svc in services.values():
            svc.stop()
        release_stack(redis_url=redis_url, pg_base=base, pg_db=args.db, tmp=tmp, keep=args.keep)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
