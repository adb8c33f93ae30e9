#!/usr/bin/env bash
# The README's second command: set up and run the whole test suite.
#
#   scripts/test.sh [pytest args...]
#
# 1. creates .venv and installs requirements (first run only);
# 2. installs (apt-get) and starts a local Redis in .services/ for the tests that run a
#    real Celery worker (stopped at the end, as PostgreSQL is, when this run started it), and installs (apt-get) Debian's chromium for the Playwright
#    browser tests in tests/browser;
# 3. installs (apt-get) and starts a local PostgreSQL in .services/;
# 4. runs the suite on the embedded SQLite default and, side by side with it (most tests
#    wait on processes, sockets and ticks: the two passes took 45 minutes on 2 cores in
#    December 2026's runs (34 in November's: the machine, not the suite, slowed), each
#    about as long as the other), again on PostgreSQL, where row locks make
#    the concurrency tests real: every test that reads a database (the tests of the pure
#    engines, accounting, the federated and distributed engines, DP-SGD's ranks, the
#    client's pieces and the settings/docs checks read none, and a few whose subject is
#    not the database -- the embedded broker's files, a federated run's Flower processes,
#    a real worker's queue, an engine's output -- run in the SQLite pass only:
#    DB_TESTS_ONLY=1, tests/conftest.py; the federated processes', the demo's and the
#    synthesis engine's tests, which read none, run in the PostgreSQL pass instead, to even
#    the two passes' lengths: PASSES_SIDE_BY_SIDE=1). The PostgreSQL pass has a var directory
#    (var/pg-pass) and a Redis database of its own; its output is in var/test-postgres.log,
#    printed after the SQLite pass's.
# On a machine where Redis, Chromium or PostgreSQL cannot be installed, what needs them is skipped
# with a warning, except under CI (CI=true) where that is a failure.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
scripts/bootstrap.sh
mkdir -p var artifacts

echo "== services" >&2
stop_redis=true
if ! scripts/services.sh redis-running 2>/dev/null; then
    # started here, stopped here (as PostgreSQL below): a Redis left running outlives the
    # clone it was started from
    stop_redis='scripts/services.sh redis-stop >&2 || true'
fi
if ! scripts/services.sh redis-start; then
    if [ "${CI:-}" = "true" ]; then
        echo "Redis could not be started; CI requires it" >&2
        exit 1
    fi
    echo "WARNING: Redis could not be started; real-worker tests will be skipped" >&2
fi
if ! scripts/services.sh chromium-install; then
    if [ "${CI:-}" = "true" ]; then
        echo "Chromium could not be installed; CI requires it" >&2
        exit 1
    fi
    echo "WARNING: Chromium could not be installed; browser tests will be skipped" >&2
fi

pg_pid=""
stop_pg=true
if ! scripts/services.sh postgres-running 2>/dev/null; then
    # started here, stopped here: a cluster left running holds the port, and the next
    # fresh clone's run (CI's) could not start its own
    stop_pg='scripts/services.sh postgres-stop >&2 || true'
fi
# the PostgreSQL pass runs in a process group of its own (setsid): stopped with everything it
# started (real workers, servers), a pass left running would go on using the next run's
# PostgreSQL on the same port
trap 'if [ -n "$pg_pid" ]; then kill -- "-$pg_pid" 2>/dev/null || true; fi; eval "$stop_pg"; eval "$stop_redis"' EXIT
if scripts/services.sh postgres-start; then
    pg_url="$(eval "$(scripts/services.sh env)"; echo "$DATABASE_URL")"
    mkdir -p var/pg-pass
    echo "== tests on PostgreSQL (beside the SQLite pass; output in var/test-postgres.log)" >&2
    PASSES_SIDE_BY_SIDE=1 DB_TESTS_ONLY=1 DATABASE_URL="$pg_url" TEST_REDIS_DB=8 \
        GOVERNANCE_VAR_DIR="$REPO/var/pg-pass" setsid .venv/bin/python -m pytest "$@" > var/test-postgres.log 2>&1 &
    pg_pid=$!
else
    if [ "${CI:-}" = "true" ]; then
        echo "PostgreSQL could not be started; CI requires it" >&2
        exit 1
    fi
    echo "WARNING: PostgreSQL could not be started; the PostgreSQL run was skipped" >&2
fi

echo "== tests on SQLite" >&2
sqlite_rc=0
side_by_side=$([ -n "$pg_pid" ] && echo 1 || echo 0)  # a few minutes of tests move to the other pass
PASSES_SIDE_BY_SIDE=$side_by_side env -u DATABASE_URL .venv/bin/python -m pytest "$@" || sqlite_rc=$?

pg_rc=0
if [ -n "$pg_pid" ]; then
    wait "$pg_pid" || pg_rc=$?
    pg_pid=""
    echo "== tests on PostgreSQL (ran beside; var/test-postgres.log)" >&2
    cat var/test-postgres.log
fi
echo "== SQLite pass exit $sqlite_rc, PostgreSQL pass exit $pg_rc" >&2
[ "$sqlite_rc" -eq 0 ] && [ "$pg_rc" -eq 0 ]
