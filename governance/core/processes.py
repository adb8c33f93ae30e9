"""Whether a process of this host is gone (its folders and files are then nobody's)."""

from __future__ import annotations

import os


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
