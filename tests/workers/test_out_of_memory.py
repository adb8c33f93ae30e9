"""A run that fails for want of memory leaves its process holding what it allocated; in a
prefork pool that process is replaced once the request's outcome is written, so the next
request does not start on a process short of memory (a probe's worker held 1.8 GB after
one). The engine is installed into the real worker by its entry point
(tests/workers/memory_hog.py)."""

import pytest

from governance.core import processes

from .conftest import ENTRY_POINTS, wait_for


def _run(client, ds, kind, epsilon=0.1):
    r = client.post("/api/requests/", {"dataset": ds.name, "engine": "memory-hog", "kind": kind,
                                       "params": {"epsilon": epsilon}}, format="json")
    assert r.status_code == 202, r.content
    rid = r.json()["id"]

    def final():
        body = client.get(f"/api/requests/{rid}/").json()
        return body if body["status"] in ("succeeded", "failed", "cancelled") else None
    return wait_for(final)


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker(pool="prefork", PYTHONPATH=ENTRY_POINTS)
def test_a_pool_process_that_ran_out_of_memory_is_replaced(real_worker, memory_hog, api, analyst, make_dataset,
                                                          grant, tmp_path):
    ds = make_dataset(epsilon=5.0)
    grant(analyst, ds)
    client = api(analyst)
    before = _run(client, ds, "pid")
    assert before["status"] == "succeeded", before
    assert before["result"]["held_mb"] == 0

    failed = _run(client, ds, "hog")
    assert failed["status"] == "failed" and failed["error"]["code"] == "request.failed_after_read", failed
    assert failed["charge"]["ledger_status"] == "committed"  # after the read: the charge stands

    after = _run(client, ds, "pid", epsilon=0.2)  # (the same request again would be answered by the first)
    assert after["status"] == "succeeded", after
    assert after["result"]["pid"] != before["result"]["pid"] and after["result"]["held_mb"] == 0, after
    assert real_worker.process.poll() is None  # the worker itself runs on
    log = (tmp_path / "worker.log").read_text()
    assert "ran out of memory: this pool process" in log


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker(pool="solo", PYTHONPATH=ENTRY_POINTS)
def test_a_solo_worker_that_ran_out_of_memory_keeps_serving(real_worker, memory_hog, api, analyst, make_dataset,
                                                           grant, tmp_path):
    """Celery's solo pool sends ``worker_process_init`` in the worker itself: it took itself
    for a pool process and exited (``Unrecoverable error``), the queued requests of every
    analyst left with no worker (a probe's, the demo's pool)."""
    ds = make_dataset(epsilon=5.0)
    grant(analyst, ds)
    client = api(analyst)
    failed = _run(client, ds, "hog")
    assert failed["status"] == "failed" and failed["error"]["code"] == "request.failed_after_read", failed
    after = _run(client, ds, "pid", epsilon=0.2)
    assert after["status"] == "succeeded", after
    assert real_worker.process.poll() is None
    assert "restart it, or run a prefork pool" in (tmp_path / "worker.log").read_text()


@pytest.mark.parametrize("error, noted", [
    (MemoryError(), True),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                  "you tried to allocate 1099511627776 bytes"), True),
    (RuntimeError("secret value 117"), False),
    (ValueError("bad"), False),
])
def test_an_out_of_memory_failure_is_seen_through_its_causes(error, noted):
    wrapped = RuntimeError("the engine failed")
    wrapped.__cause__ = error
    processes.OUT_OF_MEMORY.clear()
    try:
        processes.note_out_of_memory(wrapped)
        assert processes.OUT_OF_MEMORY.is_set() == noted
    finally:
        processes.OUT_OF_MEMORY.clear()


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker(pool="prefork", PYTHONPATH=ENTRY_POINTS, CELERY_TASK_SOFT_TIME_LIMIT="2",
                    CELERY_TASK_TIME_LIMIT="6")
def test_a_run_the_soft_limit_cannot_stop_ends_at_the_hard_limit_as_time_limit(real_worker, memory_hog, api,
                                                                               analyst, make_dataset, grant):
    """A run inside one long native call does not hear the soft time limit (a probe's SQL
    aggregate inside one OpenDP call): the hard limit killed its process, and the request
    stayed ``running`` until the sweep's grace period had passed, then ``worker_lost``. Now
    the worker finishes it at once as ``request.time_limit``, charged as a lost run, and
    serves the next one."""
    from governance.models import LedgerEntry

    ds = make_dataset(epsilon=5.0)
    grant(analyst, ds)
    client = api(analyst)
    stuck = _run(client, ds, "stuck")
    assert stuck["status"] == "failed" and stuck["error"]["code"] == "request.time_limit", stuck
    assert "hard time limit (6 s" in stuck["error"]["detail"]
    assert LedgerEntry.objects.get(request__id=stuck["id"]).status == "committed"  # after the read
    after = _run(client, ds, "pid", epsilon=0.2)
    assert after["status"] == "succeeded", after
    assert real_worker.process.poll() is None
