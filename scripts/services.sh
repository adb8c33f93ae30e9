#!/usr/bin/env bash
# Local PostgreSQL and Redis for development and tests, kept inside the repo.
#
# Usage:
#   scripts/services.sh postgres-start   # install (apt) if needed, init + start cluster
#   scripts/services.sh postgres-stop
#   scripts/services.sh postgres-running # exit 0 if this tree's cluster runs (scripts/test.sh stops one it started)
#   scripts/services.sh redis-start      # install (apt) if needed, start redis
#   scripts/services.sh redis-stop
#   scripts/services.sh redis-running    # exit 0 if a Redis answers on REDIS_PORT (scripts/test.sh stops one it started)
#   scripts/services.sh chromium-install # install Debian's chromium (apt) if missing
#   scripts/services.sh env              # print export lines:
#   eval "$(scripts/services.sh env)"    #   DATABASE_URL and REDIS_URL
#
# Environment overrides: PGPORT (default 54329), REDIS_PORT (default 63799).
#
# Everything lives in $REPO/.services/ (git-ignored): pgdata/, the unix socket
# dir pgsock/, postgres.log, redis.pid, redis.log. Both servers listen on
# 127.0.0.1 only. Every subcommand is idempotent; start on a running service
# and stop on a stopped one do nothing. Must run as root (apt-get, runuser).
# Progress goes to stderr as one-line messages; only `env` writes to stdout.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SERVICES_DIR="$REPO/.services"
PGPORT="${PGPORT:-54329}"
REDIS_PORT="${REDIS_PORT:-63799}"
PGDATA_DIR="$SERVICES_DIR/pgdata"
PGSOCK_DIR="$SERVICES_DIR/pgsock"
PGLOG="$SERVICES_DIR/postgres.log"
REDIS_PIDFILE="$SERVICES_DIR/redis.pid"
REDIS_LOG="$SERVICES_DIR/redis.log"
APT_LOG="$SERVICES_DIR/apt.log"
DB_NAME="governance"
DB_USER="governance"

log() { echo "services: $*" >&2; }
die() { echo "services: ERROR: $*" >&2; exit 1; }

ensure_services_dir() {
    mkdir -p "$SERVICES_DIR"
}

# ---------------------------------------------------------------- apt helpers

APT_UPDATED=0
apt_update_once() {
    [ "$APT_UPDATED" -eq 1 ] && return 0
    # Skip when the package lists were refreshed less than a day ago.
    if find /var/lib/apt/lists -maxdepth 1 -type f -name '*Packages*' -mtime -1 2>/dev/null | grep -q .; then
        APT_UPDATED=1
        return 0
    fi
    log "apt-get update (package lists older than 1 day)"
    if ! apt-get update >>"$APT_LOG" 2>&1; then
        tail -n 20 "$APT_LOG" >&2
        die "apt-get update failed (full log: $APT_LOG)"
    fi
    APT_UPDATED=1
}

apt_install() {
    ensure_services_dir
    apt_update_once
    log "apt-get install -y $*"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >>"$APT_LOG" 2>&1; then
        tail -n 20 "$APT_LOG" >&2
        die "apt-get install $* failed (full log: $APT_LOG)"
    fi
}

# ------------------------------------------------------------------- postgres

# Directory of the server binaries: the version matching an existing cluster
# if present, else the highest installed version. Empty if none installed.
pg_bindir() {
    if [ -f "$PGDATA_DIR/PG_VERSION" ]; then
        local v
        v="$(cat "$PGDATA_DIR/PG_VERSION")"
        if [ -x "/usr/lib/postgresql/$v/bin/postgres" ]; then
            echo "/usr/lib/postgresql/$v/bin"
            return 0
        fi
    fi
    local initdb
    initdb="$(printf '%s\n' /usr/lib/postgresql/*/bin/initdb | grep -v '\*' | sort -V | tail -n 1 || true)"
    [ -n "$initdb" ] && dirname "$initdb"
    return 0
}

as_postgres() { runuser -u postgres -- "$@"; }

pg_is_running() {
    [ -f "$PGDATA_DIR/PG_VERSION" ] || return 1
    as_postgres "$PGBIN/pg_ctl" -D "$PGDATA_DIR" status >/dev/null 2>&1
}

# The postgres user must be able to traverse every directory above .services.
ensure_traversable() {
    as_postgres test -x "$SERVICES_DIR" 2>/dev/null && return 0
    local d="$SERVICES_DIR"
    while [ "$d" != "/" ]; do
        if [ "$(( 0$(stat -c %a "$d") & 1 ))" -eq 0 ]; then
            log "chmod o+x $d (so user postgres can reach .services)"
            chmod o+x "$d"
        fi
        d="$(dirname "$d")"
    done
    as_postgres test -x "$SERVICES_DIR" || die "user postgres cannot traverse $SERVICES_DIR"
}

psql_admin() {
    "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$PGSOCK_DIR" -p "$PGPORT" -U postgres "$@"
}

postgres_start() {
    [ "$(id -u)" -eq 0 ] || die "postgres-start must run as root"
    PGBIN="$(pg_bindir)"
    if ! command -v pg_ctlcluster >/dev/null 2>&1 || [ -z "$PGBIN" ]; then
        apt_install postgresql
        PGBIN="$(pg_bindir)"
        [ -n "$PGBIN" ] || die "no /usr/lib/postgresql/*/bin/initdb after installing postgresql"
    fi
    id postgres >/dev/null 2>&1 || die "user postgres does not exist"

    ensure_services_dir
    ensure_traversable

    if pg_is_running; then
        log "postgres already running (127.0.0.1:$PGPORT, data $PGDATA_DIR)"
        return 0
    fi

    install -d -m 755 -o postgres -g postgres "$PGSOCK_DIR"
    if [ -d "$PGDATA_DIR" ] && [ "$(stat -c %U "$PGDATA_DIR")" != postgres ]; then
        # e.g. the work tree was kept but the machine (and postgres uid) changed
        log "fixing ownership of $PGDATA_DIR"
        chown -R postgres:postgres "$PGDATA_DIR"
    fi

    if [ ! -f "$PGDATA_DIR/PG_VERSION" ]; then
        log "initdb $PGDATA_DIR ($("$PGBIN/postgres" --version))"
        install -d -m 700 -o postgres -g postgres "$PGDATA_DIR"
        as_postgres "$PGBIN/initdb" -D "$PGDATA_DIR" -U postgres --auth=trust \
            -E UTF8 --locale=C.UTF-8 >/dev/null
        echo "include = 'governance.conf'" >> "$PGDATA_DIR/postgresql.conf"
    fi

    # Rewritten on every start so PGPORT overrides take effect.
    cat > "$PGDATA_DIR/governance.conf" <<EOF
# Written by scripts/services.sh -- local throwaway TEST database.
listen_addresses = '127.0.0.1'
port = $PGPORT
unix_socket_directories = '$PGSOCK_DIR'
max_connections = 200
# Durability is deliberately OFF: this cluster only holds test/dev data and
# may lose everything on a crash. Never copy these settings to production.
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
    cat > "$PGDATA_DIR/pg_hba.conf" <<'EOF'
# Written by scripts/services.sh -- trust auth, local connections only.
# TYPE  DATABASE  USER  ADDRESS        METHOD
local   all       all                  trust
host    all       all   127.0.0.1/32   trust
local   replication all                trust
host    replication all 127.0.0.1/32   trust
EOF
    chown postgres:postgres "$PGDATA_DIR/governance.conf" "$PGDATA_DIR/pg_hba.conf"

    touch "$PGLOG"
    chown postgres:postgres "$PGLOG"
    log "starting postgres on 127.0.0.1:$PGPORT (log $PGLOG)"
    if ! as_postgres "$PGBIN/pg_ctl" -D "$PGDATA_DIR" -l "$PGLOG" -w -t 60 -s start; then
        tail -n 20 "$PGLOG" >&2
        die "postgres failed to start (log: $PGLOG)"
    fi

    if [ "$(psql_admin -tAc "SELECT 1 FROM pg_roles WHERE rolname = '$DB_USER'")" != 1 ]; then
        log "creating role $DB_USER (superuser, so tests can create databases)"
        psql_admin -c "CREATE ROLE $DB_USER LOGIN SUPERUSER"
    fi
    if [ "$(psql_admin -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'")" != 1 ]; then
        log "creating database $DB_NAME"
        psql_admin -c "CREATE DATABASE $DB_NAME OWNER $DB_USER"
    fi
    log "postgres ready: postgres://$DB_USER@127.0.0.1:$PGPORT/$DB_NAME"
}

postgres_stop() {
    PGBIN="$(pg_bindir)"
    if [ -z "$PGBIN" ] || ! pg_is_running; then
        log "postgres not running"
        return 0
    fi
    log "stopping postgres"
    as_postgres "$PGBIN/pg_ctl" -D "$PGDATA_DIR" -m fast -w -t 60 -s stop
    log "postgres stopped"
}

# ---------------------------------------------------------------------- redis

redis_ping() {
    [ "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null || true)" = PONG ]
}

redis_start() {
    if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
        [ "$(id -u)" -eq 0 ] || die "redis-server is missing and installing it needs root"
        apt_install redis-server
    fi
    ensure_services_dir
    if redis_ping; then
        log "redis already running (127.0.0.1:$REDIS_PORT)"
        return 0
    fi
    log "starting redis on 127.0.0.1:$REDIS_PORT (log $REDIS_LOG)"
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --daemonize yes \
        --save '' --appendonly no --dir "$SERVICES_DIR" \
        --pidfile "$REDIS_PIDFILE" --logfile "$REDIS_LOG"
    local _
    for _ in $(seq 1 100); do
        redis_ping && { log "redis ready: redis://127.0.0.1:$REDIS_PORT/0"; return 0; }
        sleep 0.1
    done
    tail -n 20 "$REDIS_LOG" >&2 || true
    die "redis did not answer PING within 10s (log: $REDIS_LOG)"
}

redis_stop() {
    if ! command -v redis-cli >/dev/null 2>&1 || ! redis_ping; then
        log "redis not running"
        rm -f "$REDIS_PIDFILE"
        return 0
    fi
    log "stopping redis"
    local pid=""
    [ -f "$REDIS_PIDFILE" ] && pid="$(cat "$REDIS_PIDFILE")"
    redis-cli -h 127.0.0.1 -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
    local _
    for _ in $(seq 1 100); do
        if ! redis_ping && { [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; }; then
            rm -f "$REDIS_PIDFILE"
            log "redis stopped"
            return 0
        fi
        sleep 0.1
    done
    die "redis did not stop within 10s"
}

# ------------------------------------------------------------------- chromium

# Debian's chromium, driven by Playwright in tests/browser (chromium-driver is not
# needed: Playwright speaks the DevTools protocol itself).
CHROMIUM_BIN=/usr/bin/chromium

apt_has_candidate() {
    local c
    c="$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')"
    [ -n "$c" ] && [ "$c" != "(none)" ]
}

chromium_install() {
    if [ ! -x "$CHROMIUM_BIN" ]; then
        [ "$(id -u)" -eq 0 ] || die "$CHROMIUM_BIN is missing and installing it needs root"
        ensure_services_dir
        if ! apt_has_candidate chromium; then
            # Package lists may be recent but lack chromium (e.g. a trimmed image).
            log "package chromium not found in the apt lists; apt-get update"
            if ! apt-get update >>"$APT_LOG" 2>&1; then
                tail -n 20 "$APT_LOG" >&2
                die "apt-get update failed (full log: $APT_LOG)"
            fi
            APT_UPDATED=1
            apt_has_candidate chromium || die "no installable chromium package in the apt sources"
        fi
        apt_install chromium
        [ -x "$CHROMIUM_BIN" ] || die "no $CHROMIUM_BIN after installing chromium"
    fi
    log "chromium ready: $("$CHROMIUM_BIN" --version 2>/dev/null || echo "$CHROMIUM_BIN (version unknown)")"
}

# ------------------------------------------------------------------------ env

print_env() {
    echo "export DATABASE_URL=postgres://$DB_USER@127.0.0.1:$PGPORT/$DB_NAME"
    echo "export REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0"
}

usage() {
    sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
}

case "${1:-}" in
    postgres-start) postgres_start ;;
    postgres-stop)  postgres_stop ;;
    postgres-running) PGBIN="$(pg_bindir)"; [ -n "$PGBIN" ] && pg_is_running ;;
    redis-start)    redis_start ;;
    redis-stop)     redis_stop ;;
    redis-running)  command -v redis-cli >/dev/null 2>&1 && redis_ping ;;
    chromium-install) chromium_install ;;
    env)            print_env ;;
    -h|--help|help) usage ;;
    *)              usage; exit 2 ;;
esac
