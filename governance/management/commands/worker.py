import argparse

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = ("Start a Celery worker for the cpu and gpu queues on the configured broker "
            "(Redis with REDIS_URL, else the embedded filesystem broker).")

    def add_arguments(self, parser):
        parser.add_argument("--queues", "-Q", default="cpu,gpu", help="comma-separated queues (default cpu,gpu)")
        parser.add_argument("--concurrency", "-c", type=int, default=1, help="worker processes (default 1)")
        parser.add_argument("--pool", default="prefork", choices=["prefork", "solo", "threads"],
                            help="Celery pool (default prefork)")
        parser.add_argument("--loglevel", default="WARNING")
        parser.add_argument("--beat", action=argparse.BooleanOptionalAction, default=None,
                            help="also run Celery beat in this worker (the recovery sweep every minute); "
                                 "exactly one process of a deployment should. Default: on with the embedded "
                                 "broker (one machine: a dead worker's requests are re-sent within a minute "
                                 "of its restart), off with Redis (run `entrypoint.sh beat` once)")

    def handle(self, *args, queues, concurrency, pool, loglevel, beat=None, **options):
        from workers import app

        if beat is None:
            beat = settings.EMBEDDED_BROKER
        self.stderr.write(f"worker: broker {settings.CELERY_BROKER_URL.split('@')[-1]}, queues {queues}")
        argv = ["worker", "-Q", queues, "-c", str(concurrency), "--pool", pool, "--loglevel", loglevel,
                "--without-gossip", "--without-mingle", "--without-heartbeat"]
        if beat:
            argv += ["--beat", "--schedule", str(settings.VAR_DIR / "celerybeat-schedule")]
        app.worker_main(argv)
