import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand
from django.utils import timezone

from ...core import liveness
from ...models import Request
from ...requests import recovery


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Command(BaseCommand):
    help = ("Which Celery workers are alive (the heartbeat each worker writes every WORKER_HEARTBEAT_SECONDS; "
            "alive while younger than WORKER_ALIVE_SECONDS), which queued requests wait on a queue no live "
            "worker consumes, and which running requests' workers went silent (no request heartbeat for "
            "max(WORKER_ALIVE_SECONDS, 2 x REQUEST_HEARTBEAT_SECONDS) on the database's clock: the recovery "
            "sweep finishes them after REQUEST_LOST_AFTER_SECONDS), and when the recovery sweep last ran. Exit "
            "status 1 when any request waits on a queue no live worker consumes or runs on a silent worker, "
            "when the sweep has not run for 5 minutes while a request waited longer, or the heartbeats cannot "
            "be read; "
            "with --strict also when an engine's queue has no live worker at all (a health check's rule).")

    def add_arguments(self, parser):
        parser.add_argument("--ids", type=int, default=20, help="queued request ids listed per queue (default 20)")
        parser.add_argument("--strict", action="store_true",
                            help="exit 1 also when a queue of the installed engines has no live worker, even with "
                                 "nothing queued (for a health check: a dead fleet is seen before requests wait)")

    def handle(self, *args, ids=20, strict=False, **options):
        from engines import plugins

        out = self.stdout.write
        out(f"broker: {settings.CELERY_BROKER_URL.split('@')[-1]}")
        unreadable = False
        try:
            recs = liveness.records()
        except Exception as exc:  # noqa: BLE001
            out(f"workers: cannot read the heartbeats ({type(exc).__name__}: {exc})")
            recs, unreadable = [], True
        served = set()
        for r in recs:
            state = "alive" if r["alive"] else "DEAD (no heartbeat)"
            out(f"worker {r['node']} pid {r.get('pid')} on {r.get('host')} queues {','.join(r.get('queues') or [])}: "
                f"{state}, last heartbeat {_ago(r['age'])} ago")
            if r["alive"]:
                served.update(r.get("queues") or [])
        n_alive = sum(r["alive"] for r in recs)
        out(f"workers alive: {n_alive}" + ("" if n_alive else "  -- NO WORKER IS ALIVE: queued requests wait"))
        now = timezone.now()
        by_queue: dict[str, list] = {}
        queued = Request.objects.filter(status=Request.Status.QUEUED).order_by("created_at")
        for pk, engine, created in queued.values_list("pk", "engine", "created_at"):
            try:
                queue = plugins.info(engine)["queue"]
            except Exception:  # noqa: BLE001
                queue = "cpu"
            by_queue.setdefault(queue, []).append((pk, created))
        stranded = 0
        for queue, items in sorted(by_queue.items()):
            oldest = (now - items[0][1]).total_seconds()
            ok = queue in served
            line = f"queue {queue}: {len(items)} queued, oldest {_ago(oldest)}"
            if ok:
                out(line + "; served by a live worker")
                continue
            stranded += len(items)
            listed = " ".join(str(pk) for pk, _ in items[:ids]) + (" ..." if len(items) > ids else "")
            out(line + f"; NO LIVE WORKER: {listed}")
        if not by_queue:
            out("queued requests: 0")
        if getattr(settings, "EMBEDDED_BROKER", False):
            folder = Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("data_folder_in", settings.BROKER_DIR))
            bad = folder / "bad"
            n_bad = sum(1 for _ in bad.iterdir()) if bad.is_dir() else 0
            waiting = sum(1 for p in folder.glob("*.msg")) if folder.is_dir() else 0
            out(f"embedded broker: {waiting} message file(s) waiting in {folder}"
                + (f"; {n_bad} unreadable file(s) set aside in {bad} (see the worker log)" if n_bad else ""))
        late = self._sweep(out, by_queue, now)
        silent = self._running(out, recs, ids)
        out(f"(checked {time.strftime('%Y-%m-%d %H:%M:%S')}; alive = a heartbeat within "
            f"{settings.WORKER_ALIVE_SECONDS} s)")
        unserved = sorted({i.get("queue", "cpu") for i in plugins.engines().values()} - served) if strict else []
        if unserved:
            out(f"--strict: no live worker consumes queue(s) {', '.join(unserved)}")
        if stranded or silent or unreadable or unserved or late:
            sys.exit(1)

    def _sweep(self, out, by_queue: dict, now) -> bool:
        """Says when the recovery sweep last ran; True (exit 1) when it is late
        (``liveness.sweep_late``): what re-sends a queued request whose message is gone no
        longer runs (Celery beat stopped or missing)."""
        waited = max(((now - items[0][1]).total_seconds() for items in by_queue.values()), default=0.0)
        try:
            age, late = liveness.sweep_late(waited)
        except Exception as exc:  # noqa: BLE001
            out(f"recovery sweep: cannot read its last run ({type(exc).__name__}: {exc})")
            return False
        out("recovery sweep: " + ("no run recorded" if age is None else f"last ran {_ago(age)} ago")
            + (f"  -- LATE: requests have waited {_ago(waited)}; is Celery beat running (`manage.py worker` "
               "runs one; deploy: the beat service), and is a worker on the sweep queue free to run it (a "
               "worker's one process busy with a long run, or stopped, holds it back)?" if late else ""))
        return late

    def _running(self, out, recs: list[dict], ids: int) -> int:
        """Lists the running requests; returns how many have a silent worker."""
        running = list(Request.objects.filter(status=Request.Status.RUNNING).order_by("started_at")
                       .values_list("pk", "worker", "heartbeat_at", "started_at"))
        out(f"running requests: {len(running)}")
        if not running:
            return 0
        now = recovery.db_now()
        limit = max(settings.WORKER_ALIVE_SECONDS, 2 * settings.REQUEST_HEARTBEAT_SECONDS)
        nodes = {r["node"]: r["alive"] for r in recs}
        silent = []
        for pk, worker, heartbeat, started in running:
            last = heartbeat or started
            age = (now - last).total_seconds() if last else None
            if age is not None and age > limit:
                silent.append((pk, worker, age))
        for pk, worker, age in silent[:ids]:
            state = {True: "alive", False: "DEAD"}.get(nodes.get(worker), "no heartbeat record")
            how = ("the beat's sweep, once the heartbeat stood still that long while it watched (its worker is "
                   "alive)" if state == "alive" else "`manage.py recover`")
            out(f"request {pk} on {worker or 'an unnamed worker'} ({state}): SILENT, last request heartbeat "
                f"{_ago(age)} ago; the recovery sweep finishes it after {settings.REQUEST_LOST_AFTER_SECONDS} s "
                f"({how})")
        if len(silent) > ids:
            out(f"... and {len(silent) - ids} more silent")
        return len(silent)
