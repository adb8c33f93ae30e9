from django.core.management.base import BaseCommand

from ...requests.recovery import finish_restored, sweep


def _seconds(text: str) -> float:
    """A finite number of seconds above 0 (at most ten years): -1 or 0 would call every
    running request lost at once; nan or inf is no duration."""
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text[:50]!r}") from None
    if not (math.isfinite(value) and 0 < value <= 10 * 365 * 86400):
        raise argparse.ArgumentTypeError(f"seconds must be a finite number above 0 (at most ten years), got {text[:50]}")
    return value


class Command(BaseCommand):
    help = ("Finish requests whose worker died (silent for REQUEST_LOST_AFTER_SECONDS: failed; the reservation "
            "committed if the data was read, else released) and re-send queued requests not picked up within "
            "REQUEST_REQUEUE_AFTER_SECONDS. The same sweep Celery beat runs every minute (workers.sweep).")

    def add_arguments(self, parser):
        parser.add_argument("--lost-after", type=_seconds,
                            help="seconds of silence (default REQUEST_LOST_AFTER_SECONDS)")
        parser.add_argument("--requeue-after", type=_seconds,
                            help="seconds in the queue (default REQUEST_REQUEUE_AFTER_SECONDS)")
        parser.add_argument("--restored", action="store_true",
                            help="after restoring the database from a backup, before any worker starts "
                                 "(deploy/README.md, Restore): finish every request still queued or running as "
                                 "failed (request.restored), charged in full, its files kept: its answer may have "
                                 "been released after the backup; then sweep as usual")

    def handle(self, *args, lost_after=None, requeue_after=None, restored=False, **options):
        if restored:
            ids = finish_restored()
            self.stdout.write(f"restored: {len(ids)} {' '.join(ids)}".rstrip())
        result = sweep(lost_after=lost_after, requeue_after=requeue_after)
        self.stdout.write(f"lost: {len(result['lost'])} {' '.join(result['lost'])}".rstrip())
        self.stdout.write(f"requeued: {len(result['requeued'])} {' '.join(result['requeued'])}".rstrip())
