#!/usr/bin/env python
"""Client overhead: privacy_client calls next to the same HTTP calls made by hand.

    .venv/bin/python bench/bench_client.py            # 1,000 rounds (~2 min here)
    .venv/bin/python bench/bench_client.py --quick    # 150 rounds (~20 s)

It sets up a throwaway SQLite database (temp dir, migrated, a 200-row table, an analyst
with a token and a grant), starts gunicorn (``governance.wsgi``, 1 sync worker) on
loopback, then measures four API operations, each made three ways against that same
server with the same request (same URL, body and headers, including a fresh
``Idempotency-Key`` per POST):

- ``client``: the privacy_client call, to its Python object (``Client.datasets()``,
  ``Client.request()``, ``Client.estimate()``, ``Client.submit()``);
- ``requests``: a hand-written ``requests.Session`` call that parses the JSON (the raw
  call the client is built on);
- ``http.client``: a persistent ``http.client`` connection, ``json.dumps``/``json.loads``.

The operations: list the datasets; read a finished request (with its result); estimate a
grouped mean; POST a request already answered (a replay: planned, fingerprinted,
answered from the stored release, no worker and no charge). Each round runs every
(operation, way) once in a shuffled order, so the three ways share the server's and the
machine's noise. Printed: per operation and way the median and p90 in ms, and the
client's overhead over each raw way as a difference of medians (absolute, ms) and a ratio.
Also the client's own CPU per call with the network taken out (a stub session answering a
canned response), the number the 2 ms goal is about.

This machine is shared (2 cores, other work running): figures are loopback, noisy, and
only comparable within one run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import requests

from common import free_port, log, quantile, write_csv

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "client"))
from privacy_client import Backoff, Client  # noqa: E402

SETUP = r"""
import sys
from governance.datasets import registry as datasets
from django.contrib.auth import get_user_model
from governance.models import Grant
from governance.ledger import grants
from rest_framework.authtoken.models import Token
User = get_user_model()
officer = User.objects.create_user("officer", is_staff=True)
ann = User.objects.create_user("ann")
ds = datasets.register(name="clinic", created_by=officer, path=sys.argv[1], budget_epsilon=1e6,
                       schema={"age": {"lower": 18, "upper": 90}, "income": {"lower": 0, "upper": 200000},
                               "site": {"type": "categorical", "domain": ["north", "south", "east"]}},
                       activate=True)
grants.give(ann, ds, officer)
print(Token.objects.create(user=ann).key)
"""


def environment(tmp: Path) -> dict:
    (tmp / "import").mkdir(parents=True)
    return {**os.environ, "DATABASE_URL": f"sqlite:///{tmp / 'bench.sqlite3'}", "GOVERNANCE_VAR_DIR": str(tmp),
            "DATA_DIR": str(tmp / "data"), "DATASET_IMPORT_DIRS": str(tmp / "import"),
            "RESULTS_DIR": str(tmp / "results"), "DEBUG": "false", "SECRET_KEY": "bench-" + uuid.uuid4().hex,
            "ALLOWED_HOSTS": "127.0.0.1,localhost", "REQUEST_RATE_LIMIT": "", "MAX_ACTIVE_REQUESTS": "0", "RELEASE_QUANTUM_MS": "0",
            # the first (unreplayed) request runs in the web process when its transaction commits
            "CELERY_TASK_ALWAYS_EAGER": "true", "DJANGO_SETTINGS_MODULE": "governance.settings"}


def start_server(env: dict, port: int) -> subprocess.Popen:
    subprocess.run([sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=REPO, env=env, check=True)
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "governance.wsgi", "-b", f"127.0.0.1:{port}",
                             "-w", "1", "--log-level", "warning"], cwd=REPO, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200:
                return proc
        except requests.RequestException:  # not listening yet, or still importing
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start")


def operations(url: str, token: str, request_id: str):
    """(name, method, path, body, client call) of each operation."""
    count_body = {"dataset": "clinic", "engine": "aggregates", "kind": "count", "params": {"epsilon": 0.5}}
    est_body = {"engine": "aggregates", "kind": "mean",
                "params": {"column": "income", "group_by": "site", "epsilon": 0.1}}
    return [
        ("list datasets", "GET", "/api/datasets/?page_size=1000&page=1", None, lambda c: c.datasets()),
        ("read a request", "GET", f"/api/requests/{request_id}/", None, lambda c: c.request(request_id)),
        ("estimate a mean", "POST", "/api/datasets/clinic/estimate/", est_body,
         lambda c: c.estimate("clinic", "mean", column="income", group_by="site", epsilon=0.1)),
        ("POST (a replay)", "POST", "/api/requests/", count_body,
         lambda c: c.submit("clinic", "count", epsilon=0.5)),
    ]


def run(rounds: int, port: int, token: str, request_id: str) -> dict:
    url = f"http://127.0.0.1:{port}"
    client = Client(url, token=token, progress=False, backoff=Backoff())
    session = requests.Session()
    auth = {"Authorization": f"Token {token}", "Accept": "application/json"}
    conn = http.client.HTTPConnection("127.0.0.1", port)
    ops = operations(url, token, request_id)

    def by_client(op):
        op[4](client)

    def by_requests(op):
        _, method, path, body, _ = op
        headers = dict(auth)
        if method == "POST" and path == "/api/requests/":
            headers["Idempotency-Key"] = str(uuid.uuid4())
        r = session.request(method, url + path, json=body, headers=headers, timeout=60)
        r.raise_for_status()
        r.json()

    def by_http_client(op):
        _, method, path, body, _ = op
        headers = dict(auth)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if method == "POST" and path == "/api/requests/":
            headers["Idempotency-Key"] = str(uuid.uuid4())
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        payload = resp.read()
        if resp.status >= 400:
            raise RuntimeError(f"{resp.status} {payload[:200]!r}")
        json.loads(payload)

    ways = {"client": by_client, "requests": by_requests, "http.client": by_http_client}
    times = {(op[0], w): [] for op in ops for w in ways}
    cells = [(op, w) for op in ops for w in ways]
    for _ in range(3):  # warm up every path (connections, caches, imports)
        for op, w in cells:
            ways[w](op)
    rng = random.Random(0)
    for i in range(rounds):
        rng.shuffle(cells)
        for op, w in cells:
            t0 = time.perf_counter()
            ways[w](op)
            times[(op[0], w)].append(time.perf_counter() - t0)
        if (i + 1) % max(1, rounds // 5) == 0:
            log(f"  {i + 1}/{rounds} rounds")
    return {"ops": [op[0] for op in ops], "times": times}


class Canned:
    """A stub session: the recorded answer of each operation, no network."""

    def __init__(self, answers: dict):
        self.answers, self.headers = answers, {}

    def request(self, method, url, **kw):
        path = url.split("://", 1)[1].split("/", 1)[1]
        body = self.answers[path.split("?")[0]]

        class R:
            status_code, content, headers = 200, b"x", {}

            def json(self_inner):
                return json.loads(body)
        return R()


def client_cpu(port: int, token: str, request_id: str, n: int) -> dict:
    """The client's own time per call with the network replaced by the recorded answer (the
    JSON parse stays in: the raw call parses too)."""
    url = f"http://127.0.0.1:{port}"
    live = requests.Session()
    live.headers["Authorization"] = f"Token {token}"
    ops = operations(url, token, request_id)
    answers = {path.split("?")[0].lstrip("/"): live.request(method, url + path, json=body).text
               for _, method, path, body, _ in ops}
    client = Client(url, token=token, progress=False, session=Canned(answers))
    out = {}
    for name, _, path, _, call in ops:
        text = answers[path.split("?")[0].lstrip("/")]
        ts_client, ts_raw = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            call(client)
            ts_client.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            json.loads(text)  # the part a raw call does too
            ts_raw.append(time.perf_counter() - t0)
        out[name] = (statistics.median(ts_client), statistics.median(ts_raw))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=1000, help="rounds of all 12 (operation, way) cells")
    ap.add_argument("--quick", action="store_true", help="150 rounds")
    args = ap.parse_args()
    rounds = 150 if args.quick else args.rounds
    with tempfile.TemporaryDirectory(prefix="bench-client-") as d:
        tmp = Path(d)
        env = environment(tmp)
        port = free_port()
        server = start_server(env, port)
        try:
            write_csv(tmp / "import" / "clinic.csv")
            token = subprocess.run([sys.executable, "-c", "import django; django.setup(); exec(open(0).read())",
                                    str(tmp / "import" / "clinic.csv")], input=SETUP, text=True, cwd=REPO,
                                   env=env, check=True, capture_output=True).stdout.split()[-1]
            first = requests.post(f"http://127.0.0.1:{port}/api/requests/", headers={"Authorization": f"Token {token}"},
                                  json={"dataset": "clinic", "engine": "aggregates", "kind": "count",
                                        "params": {"epsilon": 0.5}}, timeout=60).json()
            assert first["status"] == "succeeded", first
            log(f"server up on 127.0.0.1:{port}; {rounds} rounds x 12 cells")
            t0 = time.monotonic()
            out = run(rounds, port, token, first["id"])
            wall = time.monotonic() - t0
            cpu = client_cpu(port, token, first["id"], 2000)
        finally:
            server.terminate()
            server.wait(20)
    report(out, cpu, rounds, wall)


def report(out: dict, cpu: dict, rounds: int, wall: float):
    t = out["times"]
    print(f"Client overhead: privacy_client vs the same call by hand, {rounds} interleaved rounds "
          f"({wall:.0f} s), loopback to gunicorn (1 sync worker) on SQLite; shared 2-core machine")
    print()
    print(f"{'operation':<18} {'way':<12} {'median ms':>10} {'p90 ms':>8}")
    for name in out["ops"]:
        for way in ("client", "requests", "http.client"):
            xs = t[(name, way)]
            print(f"{name:<18} {way:<12} {statistics.median(xs) * 1e3:>10.2f} {quantile(xs, 0.9) * 1e3:>8.2f}")
    print()
    print(f"{'operation':<18} {'client - requests':>18} {'ratio':>6} {'client - http.client':>21} {'ratio':>6}")
    for name in out["ops"]:
        c = statistics.median(t[(name, "client")])
        r = statistics.median(t[(name, "requests")])
        h = statistics.median(t[(name, "http.client")])
        print(f"{name:<18} {(c - r) * 1e3:>15.2f} ms {c / r:>6.3f} {(c - h) * 1e3:>18.2f} ms {c / h:>6.3f}")
    print()
    print("The client's own time per call, network replaced by the canned answer (median of 2,000):")
    print(f"{'operation':<18} {'client call':>12} {'json.loads alone':>17} {'client extra':>13}")
    for name, (c, raw) in cpu.items():
        print(f"{name:<18} {c * 1e6:>9.1f} us {raw * 1e6:>14.1f} us {(c - raw) * 1e6:>10.1f} us")


if __name__ == "__main__":
    main()
