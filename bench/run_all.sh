#!/usr/bin/env bash
# Run every benchmark in bench/ (for now: bench_admission.py on SQLite and PostgreSQL).
#
# Usage:
#   bench/run_all.sh                 # N = 100,000 (default of the benchmarks; ~15 min)
#   BENCH_N=2000 bench/run_all.sh    # smaller ledger, e.g. a CI smoke run
# Extra arguments are passed to bench_admission.py (e.g. --profile 1000).
# PostgreSQL is started with scripts/services.sh (idempotent; must run as root).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PY="${PYTHON:-$REPO/.venv/bin/python}"

n_args=()
if [ -n "${BENCH_N:-}" ]; then
    n_args=(--n "$BENCH_N")
fi

scripts/services.sh postgres-start
eval "$(scripts/services.sh env)"

"$PY" bench/bench_admission.py --both "${n_args[@]}" "$@"
