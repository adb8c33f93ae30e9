"""The embedded broker under stress: nothing lost, no worker death.

Issue 22: on the embedded default broker (``filesystem://``, files in var/broker) kombu's
transport let a worker read a message file before the web process had written it; the
worker died silently ("Unrecoverable error: JSONDecodeError", exit 0) about once in 8
requests of a sequential stress loop (gunicorn -w 2, load ~4), and later requests stayed
queued. ``workers/broker.py`` replaced the transport. This benchmark is the issue's goal:

    Embedded broker: 500 sequential and 200 concurrent requests, 5 runs: 0 lost, 0 worker deaths.

Each run starts the web service and one worker as deployed (``deploy/entrypoint.sh web``:
gunicorn gthread, 2 processes, so two producer processes; ``deploy/entrypoint.sh worker``:
prefork, one pool process) on the embedded broker (no REDIS_URL) and the embedded
database (SQLite; ``--database postgres`` for a throwaway PostgreSQL database), then POSTs
DP counts through the REST API: ``--sequential`` one after another, then ``--concurrent``
from ``--clients`` threads at once. Each request has its own epsilon (no replays). Then it
waits until every request is final. No recovery sweep runs (no beat): a message the broker
lost stays ``queued`` and is counted **lost**. A **worker death** is the worker's main
process gone before the run stops it, or Celery's "Unrecoverable error" in its log.

    .venv/bin/python bench/bench_embedded_broker.py            # full: 500 + 200, 5 runs
    .venv/bin/python bench/bench_embedded_broker.py --quick    # CI: 40 + 40, 1 run (tests/workers)

Prints one line per run and a last line ``RESULT lost=.. worker_deaths=.. ...``; exits 1
when anything was lost or a worker died.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, free_port, log, quantile, write_csv  # noqa: E402

DATASET = "clinic"
FINAL = ("succeeded", "failed", "cancelled")


class Proc:
    """``deploy/entrypoint.sh ROLE`` in its own session, output to a file."""

    def __init__(self, role: str, env: dict, logfile: Path):
        self.role, self.env, self.logfile = role, env, logfile
        self.f = open(logfile, "a")
        self.proc = subprocess.Popen([str(REPO / "deploy" / "entrypoint.sh"), role], cwd=REPO, env=env,
                                     stdout=self.f, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self, timeout=30):
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        try:
            os.killpg(self.proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        self.f.close()

    def text(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")
        except OSError:
            return ""


class Http:
    def __init__(self, port: int, token: str):
        self.port, self.token, self.conn = port, token, None

    def post(self, body: dict, wait: float = 0) -> tuple[int, dict]:
        url = f"/api/requests/?wait={wait:g}" if wait else "/api/requests/"
        for attempt in range(20):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60 + wait)
                self.conn.request("POST", url, json.dumps(body),
                                  {"Authorization": f"Token {self.token}", "Content-Type": "application/json",
                                   "Host": "127.0.0.1"})
                r = self.conn.getresponse()
                data = r.read()
                return r.status, (json.loads(data) if data else {})
            except (OSError, http.client.HTTPException):
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
                time.sleep(0.2 * (attempt + 1))
        return 0, {}


def wait_http(port: int, token: str, web: Proc, timeout=120):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if web.proc.poll() is not None:
            raise RuntimeError(f"web exited {web.proc.returncode}:\n{web.text()[-3000:]}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/api/me/", headers={"Authorization": f"Token {token}", "Host": "127.0.0.1"})
            ok = c.getresponse().status == 200
            c.close()
            if ok:
                return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the web service did not answer within {timeout}s:\n{web.text()[-3000:]}")


def setup(args, tmp: Path) -> dict:
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "REDIS_URL_FILE", "CELERY_BROKER_URL",
                                                             "DATABASE_URL_FILE", "SECRET_KEY_FILE")},
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "DJANGO_SETTINGS_MODULE": "governance.settings",
        "DATA_DIR": str(tmp / "data"), "DATASET_IMPORT_DIRS": str(tmp / "import"),
        "RESULTS_DIR": str(tmp / "results"), "GOVERNANCE_VAR_DIR": str(tmp / "var"),
        "MPLCONFIGDIR": str(tmp / "mpl"), "DEBUG": "false", "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "127.0.0.1,localhost", "CELERY_TASK_ALWAYS_EAGER": "false", "LOG_LEVEL": "WARNING",
        "PRIVACY_ENGINES_DISABLE_ENTRYPOINTS": "1", "REQUEST_RATE_LIMIT": "", "MAX_ACTIVE_REQUESTS": "0",
        # the outcome of a count waits for the run clock's next tick (1 s by default): the
        # broker is what is measured here, as in bench_load
        "RELEASE_QUANTUM_MS": os.environ.get("RELEASE_QUANTUM_MS", "0"),
        "GUNICORN_WORKERS": str(args.web_workers), "WORKER_QUEUES": "cpu,gpu", "WORKER_CONCURRENCY": "1",
    }
    for d in ("data", "import", "var", "results", "mpl"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    if args.database == "postgres":
        from common import create_database, pg_base_url

        env["BENCH_PG_BASE_URL"] = pg_base_url()
        env["BENCH_PG_DB"] = f"bench_embedded_broker_{os.getpid()}"
        env["DATABASE_URL"], where = create_database(env["BENCH_PG_BASE_URL"], env["BENCH_PG_DB"])
    else:
        env["DATABASE_URL"] = f"sqlite:///{tmp / 'governance.sqlite3'}"
        where = "SQLite " + env["DATABASE_URL"][10:]
    os.environ.clear()
    os.environ.update(env)
    sys.path.insert(0, str(REPO))
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token

    from governance.datasets import registry as datasets
    from governance.ledger import grants

    assert settings.CELERY_BROKER_URL.startswith("filesystem://"), settings.CELERY_BROKER_URL
    import workers  # noqa: F401 - as every process of the service: the app, and its transport for filesystem://
    from kombu.transport import resolve_transport

    transport = resolve_transport("filesystem")
    call_command("migrate", verbosity=0, interactive=False)
    User = get_user_model()
    officer = User.objects.create_user("olivia", is_staff=True)
    csv = tmp / "import" / "clinic.csv"
    write_csv(csv)
    ds = datasets.register(name=DATASET, created_by=officer, path=str(csv), budget_epsilon=1e5, budget_delta=1e-6,
                           policy="basic", schema={"age": {"lower": 18, "upper": 90}}, activate=True)
    tokens = []
    for i in range(args.clients):
        u = User.objects.create_user(f"analyst{i:02d}")
        tokens.append(Token.objects.create(user=u).key)
        grants.give(u, ds, officer)
    from django.db import connections

    connections.close_all()
    return {"env": env, "tokens": tokens, "where": where, "broker_dir": Path(settings.BROKER_DIR),
            "transport": f"{transport.__module__}.{transport.__name__}"}


def one_run(args, run: int, ctx: dict, tmp: Path) -> dict:
    from django.db import close_old_connections

    from governance.models import Request

    env, tokens = ctx["env"], ctx["tokens"]
    port = free_port()
    web = Proc("web", {**env, "PORT": str(port)}, tmp / f"web-{run}.log")
    worker = Proc("worker", env, tmp / f"worker-{run}.log")
    wait_http(port, tokens[0], web)
    t_start = time.monotonic()
    ids, refused, latencies = [], [], []
    lock = threading.Lock()
    seq = [0]

    def epsilon() -> float:  # distinct per request: no replays
        with lock:
            seq[0] += 1
            return round(0.01 + run * 1e-3 + seq[0] * 1e-7, 9)

    def ask(client: Http):
        if worker.proc.poll() is not None:
            return  # the worker died: every further request would wait --wait seconds for nothing
        t0 = time.monotonic()
        status, body = client.post({"dataset": DATASET, "engine": "aggregates", "kind": "count",
                                    "params": {"epsilon": epsilon()}}, wait=args.wait)
        with lock:
            latencies.append(time.monotonic() - t0)
            if status in (200, 201, 202) and "id" in body:
                ids.append(body["id"])
            else:
                refused.append((status, str(body)[:200]))

    client = Http(port, tokens[0])
    for _ in range(args.sequential):
        ask(client)
    t_seq = time.monotonic() - t_start
    per_client = [args.concurrent // args.clients + (1 if i < args.concurrent % args.clients else 0)
                  for i in range(args.clients)]

    def burst(i):
        c = Http(port, tokens[i])
        for _ in range(per_client[i]):
            ask(c)

    threads = [threading.Thread(target=burst, args=(i,)) for i in range(args.clients)]
    t_c = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t_conc = time.monotonic() - t_c
    # wait until every request is final, or nothing has moved for --settle seconds
    last_change, last_left = time.monotonic(), None
    while True:
        close_old_connections()
        left = Request.objects.filter(pk__in=ids).exclude(status__in=FINAL).count()
        if left != last_left:
            last_left, last_change = left, time.monotonic()
        if left == 0 or time.monotonic() - last_change > args.settle:
            break
        time.sleep(0.2)
    t_total = time.monotonic() - t_start
    worker_exit = worker.proc.poll()
    worker_log = worker.text()
    statuses = dict.fromkeys(("queued", "running") + FINAL, 0)
    for s in Request.objects.filter(pk__in=ids).values_list("status", flat=True):
        statuses[s] = statuses.get(s, 0) + 1
    bad = ctx["broker_dir"] / "bad"
    out = {
        "run": run + 1, "posted": len(latencies), "accepted": len(ids), "refused": len(refused),
        "succeeded": statuses["succeeded"], "failed": statuses["failed"],
        "lost": len(ids) - statuses["succeeded"] - statuses["failed"] - statuses["cancelled"],
        "worker_deaths": int(worker_exit is not None or "Unrecoverable error" in worker_log),
        "set_aside": len(list(bad.glob("*"))) if bad.exists() else 0,
        "seq_s": t_seq, "conc_s": t_conc, "total_s": t_total,
        "post_p50_ms": 1e3 * quantile(latencies, 0.5), "post_p99_ms": 1e3 * quantile(latencies, 0.99),
        "worker_exit": worker_exit, "refusals": refused[:3],
    }
    worker.stop()
    web.stop()
    if out["worker_deaths"]:
        lines = worker_log.splitlines()
        at = max((i for i, line in enumerate(lines) if "Unrecoverable error" in line or "Traceback" in line),
                 default=max(0, len(lines) - 30))
        tail = "\n".join(lines[at:at + 40])[-3000:]
        log(f"  run {run + 1}: the worker died (exit {worker_exit}):\n{tail}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sequential", type=int, default=500)
    ap.add_argument("--concurrent", type=int, default=200)
    ap.add_argument("--clients", type=int, default=8, help="threads of the concurrent phase (one analyst each)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--web-workers", type=int, default=2, help="gunicorn processes: the producers")
    ap.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    ap.add_argument("--wait", type=float, default=10.0,
                    help="each POST waits up to this many seconds for the answer (?wait=), as an analyst's loop "
                         "does: the worker is idle and polling when the next message is written; 0: fire and forget")
    ap.add_argument("--settle", type=float, default=60.0,
                    help="seconds without progress after which what is still queued counts as lost")
    ap.add_argument("--quick", action="store_true", help="CI setting: 40 sequential + 40 concurrent, 1 run")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.sequential, args.concurrent, args.runs, args.settle = 40, 40, 1, 30.0
    tmp = Path(tempfile.mkdtemp(prefix="bench-embedded-broker-"))
    code = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True).stdout.strip()
    t0 = time.monotonic()
    try:
        ctx = setup(args, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"embedded broker (filesystem://: {ctx['transport']}), {ctx['where']}; gunicorn gthread x "
          f"{args.web_workers}, 1 worker (prefork, 1 process); {args.sequential} sequential + {args.concurrent} "
          f"concurrent ({args.clients} clients) DP counts x {args.runs} runs; git {code}; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", flush=True)
    results = []
    try:
        for run in range(args.runs):
            r = one_run(args, run, ctx, tmp)
            results.append(r)
            print(f"run {r['run']}: posted {r['posted']}, accepted {r['accepted']}, succeeded {r['succeeded']}, "
                  f"failed {r['failed']}, lost {r['lost']}, worker deaths {r['worker_deaths']}, set aside "
                  f"{r['set_aside']}; sequential {r['seq_s']:.1f} s, concurrent {r['conc_s']:.1f} s, all final "
                  f"{r['total_s']:.1f} s; POST p50 {r['post_p50_ms']:.0f} ms p99 {r['post_p99_ms']:.0f} ms; "
                  f"load {os.getloadavg()[0]:.1f}" + (f"; refusals {r['refusals']}" if r["refused"] else ""),
                  flush=True)
    finally:
        if args.database == "postgres":
            from django.db import connections

            from common import drop_database

            connections.close_all()
            drop_database(ctx["env"]["BENCH_PG_BASE_URL"], ctx["env"]["BENCH_PG_DB"])
        if args.keep:
            log(f"(kept {tmp})")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    total = {k: sum(r[k] for r in results) for k in ("posted", "accepted", "succeeded", "failed", "lost",
                                                     "worker_deaths", "refused", "set_aside")}
    print(f"RESULT lost={total['lost']} worker_deaths={total['worker_deaths']} posted={total['posted']} "
          f"accepted={total['accepted']} succeeded={total['succeeded']} failed={total['failed']} "
          f"refused={total['refused']} set_aside={total['set_aside']} runs={len(results)} "
          f"wall={time.monotonic() - t0:.0f}s", flush=True)
    sys.exit(1 if total["lost"] or total["worker_deaths"] or total["refused"] else 0)


if __name__ == "__main__":
    main()
