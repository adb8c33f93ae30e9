import argparse

from django.conf import settings
from django.core.management.base import BaseCommand

MAX_CONCURRENCY = 256


def _queues(text: str) -> str:
    """--queues: comma-separated queue names (an engine names its queue: cpu, gpu or its own)."""
    names = [q.strip() for q in text.split(",")]
    if not all(q.isascii() and q.replace("_", "").replace("-", "").replace(".", "").isalnum() for q in names):
        raise argparse.ArgumentTypeError(f"must be comma-separated queue names (letters, digits, _ - .), not {text!r}")
    return ",".join(dict.fromkeys(names))


def _processes(text: str) -> int:
    """--concurrency: 1 to MAX_CONCURRENCY worker processes (argparse's error otherwise,
    not a traceback from Celery's option parser)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if not 1 <= n <= MAX_CONCURRENCY:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_CONCURRENCY}, not {n}")
    return n


class Command(BaseCommand):
    help = ("Start a Celery worker for the cpu and gpu queues on the configured broker "
            "(Redis with REDIS_URL, else the embedded filesystem broker).")

    def add_arguments(self, parser):
        parser.add_argument("--queues", "-Q", default="cpu,gpu", type=_queues,
                            help="comma-separated queues (default cpu,gpu; an engine may name its own); the "
                                 "recovery sweep's own queue (sweep) is always consumed too")
        parser.add_argument("--concurrency", "-c", type=_processes, default=1,
                            help=f"worker processes, 1 to {MAX_CONCURRENCY} (default 1)")
        parser.add_argument("--pool", default="prefork", choices=["prefork", "solo", "threads"],
                            help="Celery pool (default prefork)")
        parser.add_argument("--loglevel", default="WARNING",
                            help="Celery's log level: DEBUG, INFO, WARNING (default), ERROR")
        parser.add_argument("--beat", action=argparse.BooleanOptionalAction, default=None,
                            help="also run Celery beat in this worker (the recovery sweep every minute); "
                                 "exactly one process of a deployment should. Default: on with the embedded "
                                 "broker (one machine: a dead worker's requests are re-sent within a minute "
                                 "of its restart), off with Redis (run `entrypoint.sh beat` once)")

    def handle(self, *args, queues, concurrency, pool, loglevel, beat=None, **options):
        from workers import app

        if beat is None:
            beat = settings.EMBEDDED_BROKER
        queues = ",".join(dict.fromkeys([settings.SWEEP_QUEUE, *queues.split(",")]))
        self.stderr.write(f"worker: broker {settings.CELERY_BROKER_URL.split('@')[-1]}, queues {queues}")
        argv = ["worker", "-Q", queues, "-c", str(concurrency), "--pool", pool, "--loglevel", loglevel,
                "--without-gossip", "--without-mingle", "--without-heartbeat"]
        if beat:
            argv += ["--beat", "--schedule", str(settings.VAR_DIR / "celerybeat-schedule")]
        app.worker_main(argv)
