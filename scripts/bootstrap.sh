#!/usr/bin/env bash
# Bootstrap the Python environment for this repository.
#
# Usage:
#   scripts/bootstrap.sh           # create/update .venv in the repo root
#   source scripts/bootstrap.sh    # same, then activate .venv in this shell
#
# What it does (idempotent):
#   1. creates .venv with `python3 -m venv` if it does not exist ($PYTHON overrides python3);
#   2. installs torch==2.13.0 FIRST -- the CPU wheel is found locally through
#      PIP_FIND_LINKS; installing it before anything else stops other packages
#      (opacus, ...) from pulling a CUDA build of torch;
#   3. runs `pip install -r requirements.txt`.
# Steps 2-3 are skipped when .venv/.requirements.sha256 matches the sha256 of
# requirements.txt, so a second run takes well under a second.
# Progress messages go to stderr; pip runs quietly (errors still show).

# When sourced, keep `set -euo pipefail` out of the caller's shell: the work runs
# in a subshell and only the final `activate` touches the caller.
_bootstrap_sourced=0
(return 0 2>/dev/null) && _bootstrap_sourced=1
if [ "$_bootstrap_sourced" -eq 0 ]; then
    set -euo pipefail
fi

_bootstrap_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

_bootstrap_main() (
    set -euo pipefail
    repo="$1"
    venv="$repo/.venv"
    req="$repo/requirements.txt"
    stamp="$venv/.requirements.sha256"
    torch_pin="torch==2.13.0"

    log() { echo "bootstrap: $*" >&2; }

    [ -f "$req" ] || { log "ERROR: $req not found"; exit 1; }

    if [ ! -x "$venv/bin/python" ]; then
        log "creating virtualenv in $venv"
        "${PYTHON:-python3}" -m venv "$venv"
    fi

    want="$(sha256sum "$req" | cut -d' ' -f1)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        log "requirements.txt unchanged (stamp matches); nothing to install"
        exit 0
    fi

    pip=("$venv/bin/python" -m pip --quiet)
    log "installing $torch_pin first (CPU wheel from PIP_FIND_LINKS=${PIP_FIND_LINKS:-<unset>})"
    "${pip[@]}" install "$torch_pin"
    log "installing requirements.txt"
    "${pip[@]}" install -r "$req"

    printf '%s\n' "$want" > "$stamp.tmp"
    mv -f "$stamp.tmp" "$stamp"
    log "done; stamp written to $stamp"
)

if [ "$_bootstrap_sourced" -eq 1 ]; then
    if _bootstrap_main "$_bootstrap_repo"; then
        # shellcheck disable=SC1091
        . "$_bootstrap_repo/.venv/bin/activate"
        echo "bootstrap: activated $_bootstrap_repo/.venv" >&2
        unset -f _bootstrap_main
        unset _bootstrap_sourced _bootstrap_repo
    else
        unset -f _bootstrap_main
        unset _bootstrap_sourced _bootstrap_repo
        return 1
    fi
else
    _bootstrap_main "$_bootstrap_repo"
fi
