"""What the benchmarks share: printing, medians and percentiles, a free port, the small
test table, and a throwaway PostgreSQL database (created fresh, dropped at the end).

The benchmarks run as scripts (``python bench/bench_x.py``), so this directory is on
``sys.path`` and they ``import common``.
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PG = "postgres://governance@127.0.0.1:54329/governance"  # scripts/services.sh's server


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def quantile(xs, p):
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(p * (len(s) - 1)))))]


def ms(x):
    return "-" if x != x else f"{x * 1e3:,.1f}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_csv(path: Path, n: int = 200):
    """The test suite's small table (tests/conftest.py small_frame), without pandas."""
    import random

    rng = random.Random(0)
    with open(path, "w") as f:
        f.write("patient_id,age,income,site\n")
        for _ in range(n):
            f.write(f"{rng.randrange(n // 4)},{rng.randrange(18, 90)},{rng.gauss(50_000, 10_000):.2f},"
                    f"{rng.choice(['north', 'south', 'east'])}\n")


# --------------------------------------------------------------------------- PostgreSQL


def pg_conninfo(url: str) -> dict:
    import dj_database_url

    cfg = dj_database_url.parse(url)
    return dict(host=cfg["HOST"] or "127.0.0.1", port=cfg["PORT"] or 5432, user=cfg["USER"],
                password=cfg["PASSWORD"] or None, dbname=cfg["NAME"])


def pg_base_url() -> str:
    """The server to create throwaway databases on: ``BENCH_PG_BASE_URL``, else a
    PostgreSQL ``DATABASE_URL``, else scripts/services.sh's."""
    url = os.environ.get("DATABASE_URL", "")
    return os.environ.get("BENCH_PG_BASE_URL") or (url if url.startswith(("postgres://", "postgresql://"))
                                                   else DEFAULT_PG)


def create_database(base: str, db: str) -> tuple[str, str]:
    """Drop and create database ``db`` on the server of ``base``; returns its URL and a
    description of the server (version, durability settings)."""
    import psycopg

    info = pg_conninfo(base)
    try:
        with psycopg.connect(**info, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{db}"')
            version = conn.execute("SHOW server_version").fetchone()[0].split()[0]
            flags = {k: conn.execute(f"SHOW {k}").fetchone()[0]
                     for k in ("fsync", "synchronous_commit", "max_connections")}
    except psycopg.OperationalError as e:
        raise SystemExit(f"cannot reach PostgreSQL at {base} ({e}); start it with scripts/services.sh "
                         "postgres-start") from None
    user = info["user"] + (f":{info['password']}" if info["password"] else "")
    url = f"postgres://{user}@{info['host']}:{info['port']}/{db}"
    return url, f"PostgreSQL {version} db {db} on {info['host']}:{info['port']} " \
                f"({', '.join(f'{k}={v}' for k, v in flags.items())})"


def drop_database(base: str, db: str):
    """Best effort: a database left behind is reported, not fatal."""
    import psycopg

    try:
        with psycopg.connect(**pg_conninfo(base), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    except Exception as e:  # noqa: BLE001
        log(f"(could not drop {db}: {e})")


def release_stack(*, redis_url: str, pg_base: str, pg_db: str, tmp: Path, keep: bool):
    """The end of a run on the service stack, each step best effort: close this process's
    database connections, empty the run's Redis database, then drop its PostgreSQL database
    and remove ``tmp`` (kept, and said so, with ``keep``)."""
    import shutil

    try:
        from django.db import connections

        connections.close_all()
    except Exception:  # noqa: BLE001
        pass
    try:
        import redis

        redis.Redis.from_url(redis_url).flushdb()
    except Exception:  # noqa: BLE001
        pass
    if keep:
        log(f"(kept {tmp} and database {pg_db})")
    else:
        drop_database(pg_base, pg_db)
        shutil.rmtree(tmp, ignore_errors=True)


def prepare_environment(backend: str, tmp: Path, pg_db: str) -> str:
    """Settings for an in-process run on a throwaway database (a SQLite file in ``tmp``, or
    database ``pg_db`` on ``pg_base_url()``, which is kept in ``BENCH_PG_BASE_URL`` for
    ``drop_database``); returns a description of the database."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "governance.settings"
    os.environ["GOVERNANCE_VAR_DIR"] = str(tmp / "var")
    os.environ["DATA_DIR"] = str(tmp / "data")
    os.environ["DATASET_IMPORT_DIRS"] = str(tmp / "import")
    os.environ["DEBUG"] = "false"  # DEBUG=true would keep every SQL statement in memory
    os.environ["SECRET_KEY"] = "bench-" + os.urandom(16).hex()
    os.environ["ALLOWED_HOSTS"] = "localhost,testserver"
    os.environ.pop("DB_CONN_MAX_AGE", None)  # the default (persistent connections), as deployed
    (tmp / "import").mkdir(parents=True)
    (tmp / "var").mkdir()
    if backend == "sqlite":
        path = tmp / "bench.sqlite3"
        os.environ["DATABASE_URL"] = f"sqlite:///{path}"
        return f"sqlite file {path}"
    base = os.environ["BENCH_PG_BASE_URL"] = pg_base_url()
    os.environ["DATABASE_URL"], where = create_database(base, pg_db)
    return where


def dp_accounting_rdp(event: dict, orders: list):
    """An ``RdpAccountant`` of Google's dp_accounting (independent of this repository's
    accountants) on ``orders``, with the ledger event ``event`` composed into it: the
    benchmarks' recomputation of a run's epsilon (``.get_epsilon(delta)``)."""
    import dp_accounting
    from dp_accounting import rdp as rdp_lib

    def conv(e):
        k = e["kind"]
        if k == "subsampled_gaussian":
            return dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
                e["sample_rate"], dp_accounting.GaussianDpEvent(e["noise_multiplier"])), e["steps"])
        if k == "laplace":
            return dp_accounting.LaplaceDpEvent(1.0 / e["epsilon"])
        if k == "self_composed":
            return dp_accounting.SelfComposedDpEvent(conv(e["event"]), e["count"])
        if k == "composed":
            return dp_accounting.ComposedDpEvent([conv(x) for x in e["events"]])
        raise ValueError(k)

    acc = rdp_lib.RdpAccountant(orders=orders)
    acc.compose(conv(event))
    return acc
