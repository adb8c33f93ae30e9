#!/usr/bin/env bash
# Run every benchmark in bench/: admission (SQLite and PostgreSQL), DP aggregates on 10M
# rows (vs numpy/pyarrow, diffprivlib, OpenDP), DP counts through REST + Celery + Redis,
# DP-SGD (training throughput vs non-private PyTorch and Opacus; gate-to-first-epoch latency)
# synthetic data (the synthesis engine vs smartnoise-synth MST and AIM on gss_wages), the
# client's overhead over raw HTTP, accounting tightness (compose vs dp_accounting on a dense
# grid; PLD vs RDP steps), the request path (DP count vs a bare DRF insert + Celery no-op)
# and the aggregates on Dask vs the local engine (10M generated rows).
#
# Usage:
#   bench/run_all.sh                 # N = 100,000 (default of the benchmarks; ~15 min)
#   BENCH_N=2000 bench/run_all.sh    # smaller ledger, e.g. a CI smoke run
#   BENCH_QUICK=1 bench/run_all.sh   # aggregates on 1M rows, REST at 1 and 8 clients, 5 s each,
#                                    # DP-SGD with fewer steps and repeats, synthesis at epsilon 1
#                                    # only (engine MST vs smartnoise MST)
# Extra arguments are passed to bench_admission.py (e.g. --profile 1000).
# PostgreSQL is started with scripts/services.sh (idempotent; must run as root).
# bench/setup_smartnoise.sh creates bench/.venv-smartnoise (smartnoise-synth's own venv;
# idempotent, ~2.5 min and ~1.8 GB the first time).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PY="${PYTHON:-$REPO/.venv/bin/python}"

n_args=()
if [ -n "${BENCH_N:-}" ]; then
    n_args=(--n "$BENCH_N")
fi

scripts/bootstrap.sh
"$PY" -m pip install -q -r bench/requirements.txt
scripts/services.sh postgres-start
eval "$(scripts/services.sh env)"

quick=()
if [ -n "${BENCH_QUICK:-}" ]; then
    quick=(--quick)
fi

"$PY" bench/bench_admission.py --both "${n_args[@]}" "$@"
"$PY" bench/bench_aggregates.py "${quick[@]}"
"$PY" bench/bench_requests.py "${quick[@]}"
"$PY" bench/bench_client.py "${quick[@]}"
"$PY" bench/bench_dpsgd.py "${quick[@]}"
epochs=()
if [ -n "${BENCH_QUICK:-}" ]; then
    epochs=(--epochs 5)
fi
"$PY" bench/bench_dpsgd_memory.py "${epochs[@]}"
bench/setup_smartnoise.sh
"$PY" bench/bench_synthesis.py "${quick[@]}"
"$PY" bench/bench_aim_wide.py
"$PY" bench/bench_accounting.py "${quick[@]}"
"$PY" bench/bench_request_path.py "${quick[@]}"
"$PY" bench/bench_embedded_broker.py "${quick[@]}"
# distributed: 10M rows generated under var/bench (about 1 GB; never committed)
"$PY" bench/gen_partitions.py --rows 10_000_000 --partitions 8 --out var/bench/parts-10M
"$PY" bench/bench_distributed.py --data var/bench/parts-10M --exact
