"""engines/distributed/heap.py: the heap kept for a task and given back after the last one."""

import threading

import numpy as np
import pytest

from engines.distributed import heap


class _Libc:
    """Records mallopt / malloc_trim calls (the real ones change nothing a test can read)."""

    def __init__(self):
        self.calls = []

    def mallopt(self, option, value):
        self.calls.append(("mallopt", option, value))
        return 1

    def malloc_trim(self, pad):
        self.calls.append(("trim", pad))
        return 1


@pytest.fixture
def libc(monkeypatch):
    fake = _Libc()
    monkeypatch.setattr(heap, "_libc", fake)
    return fake


def test_the_settings_are_set_once_and_given_back_after_the_last_task(libc, monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")  # as Dask's nanny starts a worker
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    with heap.kept():
        with heap.kept():  # a second task of the process (another thread)
            pass
        assert libc.calls == [("mallopt", -3, heap.MMAP_BELOW), ("mallopt", -1, heap.KEEP)]
    assert libc.calls[2:] == [("mallopt", -3, 128 << 10), ("mallopt", -1, 65536), ("trim", 0)]
    assert heap._inside == 0


def test_a_failing_task_gives_the_heap_back_too(libc):
    with pytest.raises(RuntimeError):
        with heap.kept():
            raise RuntimeError("task failed")
    assert libc.calls[-1] == ("trim", 0) and heap._inside == 0


def test_threads_entering_and_leaving_at_random_leave_nothing_kept(libc):
    barrier = threading.Barrier(8)

    def task(i):
        barrier.wait()
        for _ in range(50):
            with heap.kept():
                np.sort(np.arange(i * 100)[::-1])

    threads = [threading.Thread(target=task, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert heap._inside == 0
    sets = [c for c in libc.calls if c[0] == "mallopt" and c[2] == heap.KEEP]
    trims = [c for c in libc.calls if c[0] == "trim"]
    assert len(sets) == len(trims) >= 1  # every scope opened is closed
    assert libc.calls[-1] == ("trim", 0)


def test_a_process_on_glibc_s_dynamic_threshold_is_left_alone(monkeypatch):
    """The embedded default's threads in a Celery worker: a call to mallopt would switch
    glibc's dynamic threshold off for the rest of the process."""
    monkeypatch.setattr(heap, "_libc", ...)  # looked up again
    for v in heap._SETTINGS:
        monkeypatch.delenv(v, raising=False)
    with heap.kept():
        assert heap._libc is None
    assert heap._inside == 0


def test_on_this_machine_the_real_calls_run(monkeypatch):
    monkeypatch.setattr(heap, "_libc", ...)  # looked up again
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    with heap.kept():
        assert heap._libc is not None  # glibc (Debian): mallopt and malloc_trim found
        a = np.ones(3_000_000)
    assert a.sum() == 3_000_000
    assert heap._inside == 0
