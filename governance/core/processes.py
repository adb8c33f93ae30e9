"""Whether a process of this host is gone (its folders and files are then nobody's), the
time on the clock that stamps a directory's files (to judge what a killed process left by
its age), and whether this process ran out of memory (and should be replaced)."""

from __future__ import annotations

import os
import tempfile
import threading


def gone(pid: int) -> bool:
    """True when no process ``pid`` runs on this host. Another user's process (EPERM) is
    alive: not ours to judge. This process is never gone."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def files_now(directory) -> float | None:
    """"Now" as the modification time of a file written in ``directory`` just now: the
    clock that stamps the files there (a shared volume's server, or this host), not this
    process's (a sweeping worker whose clock ran 7 hours ahead took copies being written for
    orphans and unlinked them, a probe's 500s). None if nothing can be written there."""
    try:
        fd, marker = tempfile.mkstemp(dir=directory, prefix=".now-")
    except OSError:
        return None
    try:
        os.close(fd)
        return os.stat(marker).st_mtime
    finally:
        os.unlink(marker)


OUT_OF_MEMORY = threading.Event()  # set by work that ran out of memory: this process should be replaced


def note_out_of_memory(e: BaseException) -> None:
    """Work (a request's run, a registration's read) that failed for want of memory leaves
    its process holding what it allocated (glibc keeps freed arenas; a probe's worker
    process held 1.8 GB after one), so the next work on it could fail too. Marks the
    process for replacement (``workers.tasks`` does it in a prefork pool). Seen through the
    error's causes."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        # numpy, pyarrow and Python say MemoryError; torch's CPU allocator a RuntimeError
        if isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and "can't allocate memory" in str(e)):
            OUT_OF_MEMORY.set()
            return
        e = e.__cause__ or e.__context__
