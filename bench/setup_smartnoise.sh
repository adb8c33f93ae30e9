#!/usr/bin/env bash
# Create (idempotently) bench/.venv-smartnoise: smartnoise-synth 1.0.8 in its own virtualenv,
# for bench/bench_synthesis.py, which runs its MST and AIM through bench/smartnoise_driver.py.
#
# Why apart from .venv: smartnoise-synth 1.0.8 pins mbi < 2 (the service uses mbi 2.0),
# opacus 0.14 (the service uses 1.6) and, through smartnoise-sql, opendp < 0.15 and pandas < 3.
#
# How (the same trick as scripts/bootstrap.sh): torch==2.13.0 FIRST, the CPU wheel found
# locally through PIP_FIND_LINKS, then everything else with a constraints file that holds torch
# at 2.13.0, so that no requirement can make pip fetch another (CUDA) torch. opacus 0.14 only
# asks torch >= 1.3, so the pins in bench/requirements-smartnoise.txt resolve with torch
# 2.13 and no --no-deps is needed; opacus 0.14 itself does not work with torch 2.x, but
# only smartnoise's GAN synthesizers import it, never MST or AIM.
# Skipped when bench/.venv-smartnoise/.requirements.sha256 matches the requirements file.
#
# Usage: bench/setup_smartnoise.sh      (PYTHON=python3.11 by default)
set -euo pipefail

BENCH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$BENCH/.venv-smartnoise"
req="$BENCH/requirements-smartnoise.txt"
stamp="$venv/.requirements.sha256"
torch_pin="torch==2.13.0"

log() { echo "setup_smartnoise: $*" >&2; }

if [ ! -x "$venv/bin/python" ]; then
    log "creating virtualenv in $venv"
    "${PYTHON:-python3.11}" -m venv "$venv"
fi

want="$(cat "$req" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    log "up to date ($venv)"
    exit 0
fi

constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "$torch_pin" > "$constraints"

pip=("$venv/bin/python" -m pip --quiet)
log "installing $torch_pin first (CPU wheel from PIP_FIND_LINKS=${PIP_FIND_LINKS:-<unset>})"
"${pip[@]}" install "$torch_pin"
log "installing $(basename "$req") (torch held at 2.13.0)"
"${pip[@]}" install -c "$constraints" -r "$req"

"$venv/bin/python" - <<'EOF'
import importlib.metadata as md

import torch

assert torch.__version__.startswith("2.13.0"), torch.__version__
from snsynth import Synthesizer  # noqa: F401  (MST and AIM import mbi 1.x at fit time)
import snsynth.aim, snsynth.mst  # noqa: E401,F401

print("setup_smartnoise: ok:", ", ".join(f"{p} {md.version(p)}" for p in
      ("smartnoise-synth", "mbi", "jax", "opendp", "pandas", "numpy", "torch")))
EOF

printf '%s\n' "$want" > "$stamp.tmp"
mv -f "$stamp.tmp" "$stamp"
log "done; stamp written to $stamp"
