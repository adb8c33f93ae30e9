"""Large temporary arrays on reused heap pages while a partition's work runs.

A unit-level task allocates and frees a dozen arrays of 10-20 MB (keys, sorted copies,
masks, gathered columns). Dask's nanny starts its workers with
``MALLOC_TRIM_THRESHOLD_=65536``, which returns freed heap memory to the system at once and
also fixes glibc's mmap threshold at 128 KB (it is dynamic otherwise): every one of those
arrays is a fresh ``mmap`` whose pages fault on first touch. Measured on one 1.25M-row
unit bucket of the bench's 10M-row table (k = 2 grouped mean, one process): 115 ms under
Dask's setting, 83 ms with glibc's defaults, 56-57 ms with the heap kept for the task.

``kept()`` is that scope, in a process started with such a setting (``MALLOC_TRIM_THRESHOLD_``
or ``MALLOC_MMAP_THRESHOLD_`` in its environment, as Dask's nanny starts a worker): while
any task of the process is inside it, arrays under ``MMAP_BELOW`` come from the heap and
up to ``KEEP`` bytes of free heap stay mapped; when the last one leaves, the process's
own settings come back and ``malloc_trim(0)`` returns the free pages, so between tasks a
worker holds what it held before (what Dask's memory monitor expects). A process without
them (the embedded default's threads in a Celery worker) keeps glibc's dynamic threshold,
which already reuses the heap once a large array was freed (the 83 ms above) and which a
call to ``mallopt`` would switch off for good: there ``kept()`` does nothing. Only speed
and transient memory change; no result does. Not glibc (musl, macOS): a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from contextlib import contextmanager

__all__ = ["kept", "MMAP_BELOW", "KEEP"]

MMAP_BELOW = 32 << 20  # glibc's largest mmap threshold on 64-bit
KEEP = 256 << 20  # free heap kept mapped while a task runs
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # malloc.h
_GLIBC_DEFAULT = 128 << 10
_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")

_lock = threading.Lock()
_inside = 0
_libc = ...


def _glibc():
    """libc when it is glibc and the process set its malloc thresholds, else None."""
    global _libc
    if _libc is ...:
        _libc = None
        if not any(v in os.environ for v in _SETTINGS):
            return None
        name = ctypes.util.find_library("c")
        try:
            lib = ctypes.CDLL(name) if name else None
            if lib is not None and hasattr(lib, "mallopt") and hasattr(lib, "malloc_trim"):
                _libc = lib
        except OSError:
            pass
    return _libc


def _setting(name: str) -> int:
    """The process's own value of a ``MALLOC_*_`` setting (its environment), else glibc's."""
    try:
        return int(os.environ.get(name, _GLIBC_DEFAULT))
    except ValueError:
        return _GLIBC_DEFAULT


@contextmanager
def kept():
    """Run the block with freed heap pages reused (see the module's docstring)."""
    global _inside
    libc = _glibc()
    if libc is None:
        yield
        return
    with _lock:
        _inside += 1
        if _inside == 1:
            libc.mallopt(_M_MMAP_THRESHOLD, MMAP_BELOW)
            libc.mallopt(_M_TRIM_THRESHOLD, KEEP)
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0:
                libc.mallopt(_M_MMAP_THRESHOLD, _setting("MALLOC_MMAP_THRESHOLD_"))
                libc.mallopt(_M_TRIM_THRESHOLD, _setting("MALLOC_TRIM_THRESHOLD_"))
                libc.malloc_trim(0)
