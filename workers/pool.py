"""Celery's prefork pool for the embedded broker, with queue locks a dead process cannot keep.

On a transport without an event loop (the embedded filesystem broker: Celery's ``synloop``)
the prefork pool is billiard's classic ``Pool``: one pipe to all pool processes, read under
one lock. An idle pool process waits for its next task *holding* that lock (billiard's
``SimpleQueue.get_payload``: ``with self._rlock: recv_bytes()``). Killed while it waits
(``kill -9``, the OOM killer), it never releases it: the process Celery starts in its place
blocks on the lock forever, the worker takes the next message and hands it to nobody, its
heartbeat still says alive. Seen in 2 of 5 and 3 of 4 trials (``manage.py worker`` on the
embedded broker, the idle pool process SIGKILLed after one request).

Here the pipes' locks are ``flock`` locks on a file, which the kernel releases when the
holder dies. ``settings.CELERY_WORKER_POOL`` names :class:`TaskPool`, which ``--pool
prefork`` then means; on Redis Celery uses its own per-process pipes (``AsynPool``),
untouched here.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
import weakref

from billiard.pool import Pool as BilliardPool
from celery.concurrency import prefork

from governance.core import processes


class DeathSafeLock:
    """A lock between processes (``acquire``/``release``, a context manager) held as an
    exclusive ``flock`` on ``path``: each process opens the file itself (a lock belongs to an
    open file description, which ``fork`` would share), and a holder that dies releases it."""

    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = None
        self._pid: int | None = None

    def __getstate__(self):
        return {"path": self.path}

    def __setstate__(self, state):
        self.__init__(state["path"])

    def _fileno(self) -> int:
        if self._pid != os.getpid():  # this process's own description, not its parent's
            self._fd, self._pid = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600), os.getpid()
        return self._fd

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        fd = self._fileno()
        if block and timeout is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return True
        deadline = time.monotonic() + (timeout or 0)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if not block or time.monotonic() >= deadline:
                    return False
                time.sleep(0.01)

    def release(self) -> None:
        fcntl.flock(self._fileno(), fcntl.LOCK_UN)

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


def _remove(folder: str, owner: int):
    if os.getpid() == owner:  # not in a forked child that happens to run finalizers
        shutil.rmtree(folder, ignore_errors=True)


PREFIX = "governance-pool-"


def remove_stale_folders(root: str | None = None) -> list[str]:
    """The lock folders (``PREFIX<pid>-...``) of worker processes no longer running: a worker
    killed with SIGKILL never runs its finalizer, and its folder stayed in /tmp for good."""
    removed = []
    root = root or tempfile.gettempdir()
    for name in os.listdir(root):
        pid = name[len(PREFIX):].split("-", 1)[0] if name.startswith(PREFIX) else ""
        if pid.isdigit() and processes.gone(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed.append(name)
    return removed


class BlockingPool(BilliardPool):
    """billiard's shared-pipe pool with :class:`DeathSafeLock` on both pipes: the task
    pipe's read lock (held by the idle process waiting on it) and the result pipe's write
    lock (held by a process while it writes an acknowledgement or a result)."""

    def _setup_queues(self):
        super()._setup_queues()
        remove_stale_folders()
        folder = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
        weakref.finalize(self, _remove, folder, os.getpid())
        self._inqueue._rlock = DeathSafeLock(os.path.join(folder, "tasks.lock"))
        if self._outqueue._wlock is not None:
            self._outqueue._wlock = DeathSafeLock(os.path.join(folder, "results.lock"))


class TaskPool(prefork.TaskPool):
    """Celery's prefork pool, with :class:`BlockingPool` where Celery uses billiard's."""

    BlockingPool = BlockingPool
