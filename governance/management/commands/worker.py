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
        parser.add_argument("--beat", action="store_true",
                            help="also run Celery beat in this worker (the recovery sweep every minute); "
                                 "exactly one process of a deployment should")

    def handle(self, *args, queues, concurrency, pool, loglevel, beat=False, **options):
        from workers import app

        self.stderr.write(f"worker: broker {settings.CELERY_BROKER_URL.split('@')[-1]}, queues {queues}")
        argv = ["worker", "-Q", queues, "-c", str(concurrency), "--pool", pool, "--loglevel", loglevel,
                "--without-gossip", "--without-mingle", "--without-heartbeat"]
        if beat:
            argv += ["--beat", "--schedule", str(settings.VAR_DIR / "celerybeat-schedule")]
        app.worker_main(argv)
