"""Where a request's released files live, and the results disk's checks.

A run writes into its scratch directory; ``execution._keep_files`` renames it to the
request's results directory before the outcome is written (so a success is never written
without its files). A run whose outcome is then not written as its own (the recovery
sweep finished the request first: a worker killed, stopped or paused past
REQUEST_LOST_AFTER_SECONDS) leaves files that no release names: ``drop_unreleased``
removes them where that is seen (the sweep, the dropped outcome).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from django.conf import settings


def results_dir(request_id) -> Path:
    """Where a request's files live (a replay serves the files of the request it replays)."""
    return Path(settings.RESULTS_DIR) / str(request_id)


def drop_files(request_id) -> None:
    """Remove a request's results directory (a request that did not succeed: rows'
    derivatives, a model or a table, nobody may download, left on the disk for good)."""
    shutil.rmtree(results_dir(request_id), ignore_errors=True)


def drop_unreleased(request_id) -> None:
    """``drop_files`` unless the request succeeded (its run kept them, its own outcome was
    not written: another delivery's may have been)."""
    from ..models import Request

    if not Request.objects.filter(pk=request_id, status=Request.Status.SUCCEEDED).exists():
        drop_files(request_id)


def check_writable(path: Path) -> None:
    """Raise ``OSError`` (a refund, before the read) when the results disk under ``path``
    is read-only, not writable for this process, or has less than RESULTS_MIN_FREE_MB
    free. Creating a directory succeeds on a full disk, and a run's scratch directory is
    kept between runs: without this, a full disk was found after the read, and charged."""
    st = os.statvfs(path)
    if st.f_flag & os.ST_RDONLY:
        raise OSError(errno.EROFS, "the results disk is read-only")
    if not os.access(path, os.W_OK):
        raise OSError(errno.EACCES, "the results directory is not writable")
    if _under_minimum(st):
        raise OSError(errno.ENOSPC, f"the results disk has {_free(st) // 2**20} MB free, under RESULTS_MIN_FREE_MB "
                                    f"({settings.RESULTS_MIN_FREE_MB})")


def disk_full() -> bool:
    """Whether the results disk has less than RESULTS_MIN_FREE_MB free now, or is read-only (a run that failed
    writing its files may say so to the analyst: a fact about the server, not the data)."""
    try:
        st = os.statvfs(settings.RESULTS_DIR)
    except OSError:
        return False
    return _under_minimum(st) or bool(st.f_flag & os.ST_RDONLY)


def _free(st: os.statvfs_result) -> int:
    return st.f_bavail * st.f_frsize


def _under_minimum(st: os.statvfs_result) -> bool:
    return _free(st) < settings.RESULTS_MIN_FREE_MB * 2**20
