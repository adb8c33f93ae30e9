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

echo "== tests on SQLite" >&2
env -u DATABASE_URL .venv/bin/python -m pytest "$@"

echo "== tests on PostgreSQL" >&2
if ! scripts/services.sh postgres-running 2>/dev/null; then
    # started here, stopped here: a cluster left running holds the port, and the next
    # fresh clone's run (CI's) could not start its own
    trap 'scripts/services.sh postgres-stop >&2 || true' EXIT
fi
if scripts/services.sh postgres-start; then
    eval "$(scripts/services.sh env)"
    export DATABASE_URL
    DB_TESTS_ONLY=1 .venv/bin/python -m pytest "$@"
else
    if [ "${CI:-}" = "true" ]; then
        echo "PostgreSQL could not be started; CI requires it" >&2
        exit 1
    fi
    echo "WARNING: PostgreSQL could not be started; the PostgreSQL run was skipped" >&2
fi
