"""Which Celery workers are alive: a heartbeat each worker writes, read cheaply.

A worker (``workers.tasks``: Celery's ``worker_ready`` signal) starts a thread that writes a
small record every ``WORKER_HEARTBEAT_SECONDS`` (default 10): its node name, pid, queues
and the time (``stamp``: Redis's clock, or on one machine its monotonic clock; never the
worker's wall clock alone). A worker is **alive** while its last record is younger than
``WORKER_ALIVE_SECONDS`` (default 3 beats). A clean stop removes the record; a worker that
dies (``kill -9``, an unrecoverable error) simply stops writing.

Where the records live follows the broker, since that is what web and workers share:
with ``REDIS_URL``, one Redis hash (``governance:workers``); with the embedded broker, one
JSON file per worker in ``<GOVERNANCE_VAR_DIR>/workers/``; a record per worker process
(node and pid), the dead ones of a node on this host removed when it starts again. Reading is one ``HGETALL`` or one
small directory listing: cheap enough for the officer's dashboard on every view.

Read by ``manage.py workers`` and the officer's dashboard (a warning when no worker is
alive); Celery's ``inspect ping`` (deploy/entrypoint.sh health) asks one node over the
broker and waits, which is too slow for a page.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

from django.conf import settings

log = logging.getLogger(__name__)
REDIS_KEY = "governance:workers"


def _redis():
    import redis

    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=2)


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


BOOT_ID = _boot_id()  # this machine's boot: its monotonic clock is one for every process on it


def _redis_now(r) -> float:
    seconds, micros = r.time()
    return seconds + micros / 1e6


def stamp() -> dict:
    """A beat's time, on a clock its readers share, not the writer's wall clock (a probe: a
    worker 10 minutes behind read as DEAD while it served, a dead one 2 hours ahead as
    alive, as did a dead one after its host's clock was stepped back). With Redis, Redis's
    own clock (``TIME``), which readers ask too; with the embedded broker (one machine),
    the machine's monotonic clock beside its boot id, and the wall time for anyone else."""
    if settings.REDIS_URL:
        return {"at": _redis_now(_redis())}
    return {"at": time.time(), "mono": time.monotonic(), "boot": BOOT_ID}


def _folder() -> Path:
    return Path(settings.VAR_DIR) / "workers"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.@" else "_" for c in name)[:200]


def _key(node: str, pid) -> str:
    """A record per worker process: two ``manage.py worker`` on one host (one per queue) are
    both ``celery@<host>``, and one record keyed by the node flipped between them (a probe:
    ``workers --strict`` said no live worker served the cpu queue while one did)."""
    return f"{node}#{pid}"


def write(record: dict):
    """Store one worker's record (``record["node"]`` and ``record["pid"]`` name it)."""
    data = json.dumps(record)
    key = _key(record["node"], record.get("pid"))
    if settings.REDIS_URL:
        _redis().hset(REDIS_KEY, key, data)
        return
    folder = _folder()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{_safe(key)}.json"
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(data)
    os.replace(tmp, path)  # a reader never sees half a record


def remove(node: str, pid):
    _remove_key(_key(node, pid))


def _remove_key(key: str):
    if settings.REDIS_URL:
        _redis().hdel(REDIS_KEY, key)
        return
    try:
        (_folder() / f"{_safe(key)}.json").unlink()
    except FileNotFoundError:
        pass


def process_gone(pid) -> bool:
    """No process of this host has this id (one that cannot be asked counts as alive)."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, TypeError, ValueError, OverflowError):
        return False
    return False


def process_key(pid: int) -> str:
    """A process as a request's claim and a liveness record name it: its id and, on Linux,
    its start time (clock ticks since boot, /proc/<pid>/stat), so a process started again
    under the same id (a container's worker is pid 1 after each restart: a probe) is not
    taken for the one that died."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
        return f"{int(pid)}@{stat[stat.rindex(')') + 2:].split()[19]}"
    except (OSError, ValueError, IndexError):
        return str(pid)


def forget_dead_here(node: str):
    """Remove this node's records of processes of this host that are gone (an earlier run
    of this worker, killed): a record per process would otherwise pile up as DEAD."""
    host = socket.gethostname()
    for rec in records():
        if rec.get("node") == node and rec.get("host") == host and rec.get("pid") != os.getpid() \
                and process_gone(rec.get("pid")):
            _remove_key(rec["key"])


def _age(rec: dict, now: float, mono: float) -> float:
    """Seconds since ``rec``'s stamp: on this machine's monotonic clock when it was written
    here since the last boot, else on the shared clock (``now``: Redis's or the wall's)."""
    same_boot = BOOT_ID is not None and rec.get("boot") == BOOT_ID and "mono" in rec
    return mono - float(rec["mono"]) if same_boot else now - float(rec["at"])


def records() -> list[dict]:
    """Every stored record, alive or not, with ``age`` (seconds) and ``alive`` added;
    newest first. An unreachable store raises."""
    now, mono = time.time(), time.monotonic()
    raw = []
    if settings.REDIS_URL:
        pipe = _redis().pipeline(transaction=False)
        items, (seconds, micros) = pipe.hgetall(REDIS_KEY).time().execute()
        raw, now = [(k.decode(), v) for k, v in items.items()], seconds + micros / 1e6
    else:
        try:
            raw = [(p.stem, p.read_bytes()) for p in _folder().glob("*.json")]
        except FileNotFoundError:
            raw = []
    out = []
    for key, item in raw:
        try:
            rec = json.loads(item)
            age = _age(rec, now, mono)
        except (ValueError, KeyError, TypeError):
            continue
        rec["key"] = key  # where it is stored (a record from before one per process: the node alone)
        rec["age"] = max(0.0, age)
        rec["alive"] = age < settings.WORKER_ALIVE_SECONDS
        out.append(rec)
    return sorted(out, key=lambda r: r["age"])


SWEEP_KEY = "governance:sweep"


def sweep_ran():
    """The recovery sweep (``workers.sweep``) finished a run now: ``manage.py workers`` says
    when it last did (a stopped or missing beat, which sends it, held requests queued for
    good while every worker looked alive)."""
    data = json.dumps({**stamp(), "pid": os.getpid(), "host": socket.gethostname()})
    if settings.REDIS_URL:
        _redis().set(SWEEP_KEY, data)
        return
    folder = _folder()
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"sweep.{os.getpid()}.tmp"
    tmp.write_text(data)
    os.replace(tmp, folder / "sweep.last")  # not *.json: not a worker's record


def sweep_age() -> float | None:
    """Seconds since the recovery sweep last finished (None: no run recorded). An
    unreachable store raises."""
    if settings.REDIS_URL:
        r = _redis()
        raw, now = r.get(SWEEP_KEY), _redis_now(r)
    else:
        try:
            raw = (_folder() / "sweep.last").read_bytes()
        except FileNotFoundError:
            raw = None
        now = time.time()
    if raw is None:
        return None
    try:
        rec = json.loads(raw)
        return max(0.0, _age(rec, now, time.monotonic()))
    except (ValueError, KeyError, TypeError):
        return None


#: the sweep runs every minute: five missed while a request waited longer is a stopped beat
SWEEP_LATE_SECONDS = 300


def sweep_late(waited: float) -> tuple[float | None, bool]:
    """(seconds since the sweep last ran or None, whether it is late): late when it has not
    run for ``SWEEP_LATE_SECONDS`` while a request has waited ``waited`` seconds, longer."""
    age = sweep_age()
    return age, (age is None or age > SWEEP_LATE_SECONDS) and waited > SWEEP_LATE_SECONDS


def alive() -> list[dict]:
    return [r for r in records() if r["alive"]]


def summary() -> dict:
    """For the dashboard: ``{"checked": bool, "alive": [records], "error": str|None,
    "sweep_late": bool}``. Never
    raises; not checked when tasks run in-process (``CELERY_TASK_ALWAYS_EAGER``)."""
    from workers import app

    if app.conf.task_always_eager:
        return {"checked": False, "alive": [], "error": None, "sweep_late": False}
    try:
        return {"checked": True, "alive": alive(), "error": None, "sweep_late": _sweep_late_now()}
    except Exception as exc:  # noqa: BLE001 - the page must render
        return {"checked": True, "alive": [], "error": f"{type(exc).__name__}: {exc}", "sweep_late": False}


def _sweep_late_now() -> bool:
    from django.utils import timezone

    from ..models import Request

    oldest = Request.objects.filter(status=Request.Status.QUEUED).order_by("created_at").values_list(
        "created_at", flat=True).first()
    return sweep_late((timezone.now() - oldest).total_seconds() if oldest else 0.0)[1]


class Heartbeat:
    """The worker's side: a daemon thread writing this node's record until ``stop()``."""

    def __init__(self, node: str, queues: list[str], interval: float | None = None):
        self.node = node
        self.record = {"node": node, "host": socket.gethostname(), "pid": os.getpid(),
                       "process": process_key(os.getpid()), "queues": sorted(queues),
                       "broker": settings.CELERY_BROKER_URL.split("@")[-1].split("://")[0],
                       "started": time.time()}
        self.interval = settings.WORKER_HEARTBEAT_SECONDS if interval is None else interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="governance-heartbeat", daemon=True)

    def start(self):
        try:
            forget_dead_here(self.node)
        except Exception:  # noqa: BLE001 - only tidiness
            log.warning("dead workers' heartbeats could not be removed", exc_info=True)
        self.beat()
        self._thread.start()
        return self

    def beat(self):
        try:
            write({**self.record, **stamp()})
        except Exception:  # noqa: BLE001 - a missed beat is retried; the worker keeps working
            log.warning("worker heartbeat could not be written", exc_info=True)

    def _run(self):
        while not self._stop.wait(self.interval):
            self.beat()

    def stop(self):
        self._stop.set()
        if os.getpid() != self.record["pid"]:
            return  # a pool process forked after the start: the record is its parent's
        # a beat under way finishes first: written after the removal, it made a stopped
        # worker read as alive for WORKER_ALIVE_SECONDS (`manage.py workers` exited 0)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        try:
            remove(self.node, self.record["pid"])
        except Exception:  # noqa: BLE001
            log.warning("worker heartbeat could not be removed", exc_info=True)
