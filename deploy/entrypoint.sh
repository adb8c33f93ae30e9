#!/usr/bin/env bash
# Entry point of the service's image: the web service, the workers and the one-shot jobs
# all run this script, with their settings in the environment (deploy/.env.example).
#
#   entrypoint.sh web              manage.py check --deploy, migrate (MIGRATE_ON_START), then
#                                  gunicorn governance.wsgi on 0.0.0.0:$PORT
#   entrypoint.sh worker           a Celery worker on the queues $WORKER_QUEUES (manage.py worker)
#   entrypoint.sh beat             Celery beat: the periodic tasks of settings.CELERY_BEAT_SCHEDULE
#                                  (the recovery sweep); exactly ONE per deployment
#   entrypoint.sh migrate          manage.py migrate --noinput (the one-shot job)
#   entrypoint.sh wait-migrations  wait until the database exists and has every migration applied
#                                  (init container of web and workers); gives up after
#                                  $MIGRATE_WAIT_SECONDS
#   entrypoint.sh health [web|worker|beat]
#                                  exit 0 when the service in this container answers: web: HTTP GET
#                                  $HEALTHCHECK_PATH below 500; worker: `celery inspect ping` of this
#                                  host's node; beat: nothing to ask. Without an argument, the role
#                                  is read from PID 1's command line (the image's HEALTHCHECK).
#   entrypoint.sh manage ARGS...   python manage.py ARGS (e.g. `manage audit verify`)
#   entrypoint.sh ANYTHING...      run it as it is (a shell, python, ...)
#
# Outside the image (tests/deploy/) the script runs from the repository: it works from the
# directory above its own, with the first `python` on PATH.
set -euo pipefail

APP_DIR="${APP_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
cd "$APP_DIR"

log() { echo "entrypoint: $*" >&2; }

is_true() {
    case "$(echo "${1:-}" | tr '[:upper:]' '[:lower:]')" in
        1 | true | yes | on) return 0 ;;
        *) return 1 ;;
    esac
}

# ------------------------------------------------------------------------ web
web() {
    # The deploy checks refuse to serve with the development SECRET_KEY or DEBUG on
    # (governance.E001/E002); warnings are printed, not fatal.
    python manage.py check --deploy --fail-level ERROR
    if is_true "${MIGRATE_ON_START:-true}"; then
        python manage.py migrate --noinput
    fi
    log "gunicorn governance.wsgi on 0.0.0.0:${PORT:-8000}"
    # gthread workers: a slow upload or download holds a thread, not the whole process.
    # A worker is recycled after max-requests (a guard against slow leaks). Each recycle
    # boots a new worker (Django and the engines' imports, about a CPU second) while the
    # other workers serve alone: at 1,000 it happened every few seconds under load and set
    # the 64-client p99 (bench/README.md, "Request path"); 20,000 is a few minutes at
    # full load.
    # The control socket is off: it would be written under $HOME, read-only in Kubernetes.
    exec python -m gunicorn governance.wsgi:application \
        --bind "0.0.0.0:${PORT:-8000}" \
        --worker-class gthread \
        --workers "${GUNICORN_WORKERS:-2}" \
        --threads "${GUNICORN_THREADS:-4}" \
        --timeout "${GUNICORN_TIMEOUT:-120}" \
        --graceful-timeout "${GUNICORN_GRACEFUL_TIMEOUT:-30}" \
        --keep-alive "${GUNICORN_KEEPALIVE:-5}" \
        --max-requests "${GUNICORN_MAX_REQUESTS:-20000}" \
        --max-requests-jitter "${GUNICORN_MAX_REQUESTS_JITTER:-2000}" \
        --forwarded-allow-ips "${GUNICORN_FORWARDED_ALLOW_IPS:-127.0.0.1}" \
        --worker-tmp-dir "${GUNICORN_WORKER_TMP_DIR:-/dev/shm}" \
        --access-logfile - \
        --error-logfile - \
        --no-control-socket
}

# -------------------------------------------------------------------- workers
worker() {
    exec python manage.py worker \
        -Q "${WORKER_QUEUES:-cpu}" \
        -c "${WORKER_CONCURRENCY:-1}" \
        --pool "${WORKER_POOL:-prefork}" \
        --loglevel "${WORKER_LOGLEVEL:-INFO}"
}

beat() {
    # The schedule file only remembers when each entry last ran: /tmp is enough.
    exec python -m celery -A workers beat \
        --loglevel "${WORKER_LOGLEVEL:-INFO}" \
        --schedule "${BEAT_SCHEDULE_FILE:-/tmp/celerybeat-schedule}" \
        --pidfile=
}

# ----------------------------------------------------------------- migrations
wait_migrations() {
    local deadline=$((SECONDS + ${MIGRATE_WAIT_SECONDS:-600}))
    until python manage.py migrate --check >/dev/null 2>&1; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            log "migrations still not applied after ${MIGRATE_WAIT_SECONDS:-600}s:"
            python manage.py migrate --check || true
            exit 1
        fi
        log "waiting for the database and its migrations (the migrate job)"
        sleep 5
    done
    log "database migrated"
}

# --------------------------------------------------------------------- health
# PID 1 is the process `exec`ed by this script, or an init (docker run --init, compose
# `init: true`) whose command line still holds this script's arguments. HEALTHCHECK_PID
# names another process (tests).
role_of_pid1() {
    local cmd
    cmd="$(tr '\0' ' ' <"/proc/${HEALTHCHECK_PID:-1}/cmdline" 2>/dev/null || true) "
    case "$cmd" in
        *gunicorn* | *"entrypoint.sh web "*) echo web ;;
        *"manage.py worker"* | *celeryd* | *"entrypoint.sh worker "*) echo worker ;;
        *" beat "*) echo beat ;;
        *) echo unknown ;;
    esac
}

health() {
    local role="${1:-$(role_of_pid1)}"
    case "$role" in
        web)
            # Any answer below 500 means gunicorn and Django are up. The Host header must be
            # one of ALLOWED_HOSTS (Django answers 400 to any other).
            exec python - <<'EOF'
import os, sys, urllib.error, urllib.request

class NoRedirect(urllib.request.HTTPRedirectHandler):  # a redirect (SECURE_SSL_REDIRECT) is an answer
    def redirect_request(self, *args, **kwargs):
        return None


url = f"http://127.0.0.1:{os.environ.get('PORT', '8000')}{os.environ.get('HEALTHCHECK_PATH', '/healthz')}"
req = urllib.request.Request(url, headers={"Host": os.environ.get("HEALTHCHECK_HOST", "localhost")})
try:
    opener = urllib.request.build_opener(NoRedirect)
    status = opener.open(req, timeout=float(os.environ.get("HEALTHCHECK_TIMEOUT", "10"))).status
except urllib.error.HTTPError as e:
    status = e.code
except Exception as e:  # noqa: BLE001
    sys.exit(f"health: {url}: {e}")
print(f"health: {url}: {status}")
sys.exit(0 if status < 500 else 1)
EOF
            ;;
        worker)
            # The worker's main process answers remote-control pings even while its pool
            # runs a long task (prefork pool; a busy `solo` pool does not answer).
            exec python -m celery -A workers inspect ping \
                --destination "celery@$(hostname)" --timeout "${HEALTHCHECK_TIMEOUT:-10}"
            ;;
        beat) exit 0 ;;  # PID 1 is alive: that is all beat can tell
        *)
            log "health: no service to check in this container (PID 1: $(role_of_pid1))"
            exit 0
            ;;
    esac
}

cmd="${1:-web}"
[ "$#" -gt 0 ] && shift
case "$cmd" in
    web) web ;;
    worker) worker ;;
    beat) beat ;;
    migrate) exec python manage.py migrate --noinput ;;
    wait-migrations) wait_migrations ;;
    health) health "$@" ;;
    manage) exec python manage.py "$@" ;;
    -h | --help | help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' ;;
    *) exec "$cmd" "$@" ;;
esac
