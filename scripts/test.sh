#!/usr/bin/env bash
# The README's second command: set up and run the whole test suite.
#
#   scripts/test.sh [pytest args...]
#
# 1. creates .venv and installs requirements (first run only);
# 2. installs (apt-get) and starts a local Redis in .services/ for the tests that run a
#    real Celery worker, and installs (apt-get) Debian's chromium for the Playwright
#    browser tests in tests/browser;
# 3. runs the suite on the embedded SQLite default;
# 4. installs (apt-get) and starts a local PostgreSQL in .services/ and runs the suite
#    again on it, where row locks make the concurrency tests real: every test that reads a
#    database (the tests of the pure engines, accounting, the federated and distributed
#    engines, DP-SGD's ranks, the client's pieces and the settings/docs checks read none,
#    and a few whose subject is not the database -- the embedded broker's files, a
#    federated run's Flower processes, a real worker's queue, an engine's output -- ran in
#    step 3 only: DB_TESTS_ONLY=1, tests/conftest.py).
# Steps 3 and 4 run side by side (most tests use one core; on 2 cores the two passes take
# about as long as the SQLite one alone): the PostgreSQL pass's real workers use their own
# Redis databases (TEST_REDIS_DB, TEST_WAIT_REDIS_DB), and its output is printed when both
# are done (artifacts/pytest-postgresql.log). TEST_PASSES=sequential runs them one after
# the other, each printing as it goes.
# On a machine where Redis, Chromium or PostgreSQL cannot be installed, what needs them is skipped
# with a warning, except under CI (CI=true) where that is a failure.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
scripts/bootstrap.sh
mkdir -p var artifacts

echo "== services" >&2
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

pg_ready=0
if scripts/services.sh postgres-start; then
    pg_ready=1
elif [ "${CI:-}" = "true" ]; then
    echo "PostgreSQL could not be started; CI requires it" >&2
    exit 1
else
    echo "WARNING: PostgreSQL could not be started; the PostgreSQL pass will be skipped" >&2
fi

sqlite_pass() {
    env -u DATABASE_URL .venv/bin/python -m pytest "$@"
}
postgres_pass() {
    (
        eval "$(scripts/services.sh env)"
        export DATABASE_URL REDIS_URL
        DB_TESTS_ONLY=1 TEST_REDIS_DB=8 TEST_WAIT_REDIS_DB=15 .venv/bin/python -m pytest -p no:cacheprovider "$@"
    )
}

if [ "$pg_ready" = 0 ]; then
    echo "== tests on SQLite" >&2
    sqlite_pass "$@"
elif [ "${TEST_PASSES:-parallel}" = "sequential" ]; then
    echo "== tests on SQLite" >&2
    sqlite_pass "$@"
    echo "== tests on PostgreSQL" >&2
    postgres_pass "$@"
else
    echo "== tests on SQLite and, side by side, on PostgreSQL (its output follows)" >&2
    postgres_pass "$@" > artifacts/pytest-postgresql.log 2>&1 &
    pg_pid=$!
    sqlite_rc=0
    sqlite_pass "$@" || sqlite_rc=$?
    pg_rc=0
    wait "$pg_pid" || pg_rc=$?
    echo "== tests on PostgreSQL (ran beside the SQLite pass)" >&2
    cat artifacts/pytest-postgresql.log
    echo "== SQLite pass exit $sqlite_rc, PostgreSQL pass exit $pg_rc" >&2
    [ "$sqlite_rc" = 0 ] && [ "$pg_rc" = 0 ]
fi
