"""A scheduler that stops answering while its connection stays open (SIGSTOP: a frozen
process, a paused VM, a half-open link). A probe's run waited the whole freeze: distributed's
``scheduler_info`` has no timeout, so the run's thread heard no cancel and no lost cluster,
and a run started then never failed as unreachable. The scheduler and its worker are real
processes here, so the scheduler can be frozen."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import dask
import pytest

from engines.distributed import cluster
from engines.types import Cancelled

DASK = str(Path(sys.executable).with_name("dask"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def frozen_cluster(tmp_path, monkeypatch):
    """(address, freeze, thaw) of a scheduler and one worker in processes of their own."""
    address = f"tcp://127.0.0.1:{_free_port()}"
    # the workers import the engine's code, as a deployment's do (cluster.client's worker plugin)
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "False",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    sched = subprocess.Popen([DASK, "scheduler", "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1],
                              "--no-dashboard"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = subprocess.Popen([DASK, "worker", address, "--nthreads", "1", "--nworkers", "1", "--no-dashboard",
                               "--local-directory", str(tmp_path)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    monkeypatch.setattr(cluster, "NO_WORKER_SECONDS", 8.0)
    try:
        cluster.client(address).wait_for_workers(1, timeout=60)
        yield address, lambda: sched.send_signal(signal.SIGSTOP), lambda: sched.send_signal(signal.SIGCONT)
    finally:
        sched.send_signal(signal.SIGCONT)
        c = cluster._clients.pop(address, None)
        if c is not None:
            c.close(timeout=5)
        _end(worker, sched)


def _end(*processes) -> None:
    for p in processes:
        p.terminate()
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()


def _raised_within(seconds: float, thaw, run) -> BaseException:
    """What ``run()`` raised, in a thread given ``seconds``; past them the scheduler is
    thawed (the run then ends) and the test fails rather than hang with it."""
    out = []

    def target():
        try:
            run()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out.append(e)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        thaw()
        t.join(60)
        pytest.fail(f"the run waited out the frozen scheduler (over {seconds} s)")
    assert out, "the run ended without an error"
    return out[0]


def test_a_cancel_is_heard_while_the_scheduler_is_frozen(frozen_cluster):
    address, freeze, thaw = frozen_cluster
    calls = []

    def progress(info):
        calls.append(time.monotonic())
        if len(calls) == 1:
            freeze()
        elif time.monotonic() - calls[0] > cluster.WORKER_CHECK_SECONDS + 1:  # after a check of the workers
            raise Cancelled("cancelled by the analyst")

    e = _raised_within(20, thaw, lambda: cluster.compute(dask.delayed(time.sleep)(30), address, retries=0,
                                                         progress=progress))
    assert isinstance(e, (Cancelled, cluster.ClusterUnavailable)), e


def test_a_run_that_starts_on_a_frozen_scheduler_fails_as_unreachable(frozen_cluster):
    address, freeze, thaw = frozen_cluster
    cluster.take_submitted()  # a new run on this thread (the host does it at each request's start)
    freeze()
    e = _raised_within(cluster.SCHEDULER_ANSWER_SECONDS + 10, thaw, lambda: cluster.compute(
        dask.delayed(time.sleep)(30), address, retries=0, progress=lambda info: None))
    assert isinstance(e, cluster.ClusterUnavailable) and e.nothing_read, e


def test_a_cluster_without_the_engines_code_is_a_refund_that_says_so(tmp_path):
    """Workers that cannot import the engine's code cannot take its worker plugin (which
    keeps rows off their disks) nor run its tasks: nothing is sent, refunded, said why."""
    address = f"tcp://127.0.0.1:{_free_port()}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    sched = subprocess.Popen([DASK, "scheduler", "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1],
                              "--no-dashboard"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             cwd=tmp_path)
    worker = subprocess.Popen([DASK, "worker", address, "--nthreads", "1", "--no-dashboard", "--local-directory",
                               str(tmp_path)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              cwd=tmp_path)
    try:
        from distributed import Client

        with Client(address, timeout="30s") as plain:
            plain.wait_for_workers(1, timeout=60)
        with pytest.raises(cluster.ClusterUnavailable, match="could not load the engine's code") as e:
            cluster.compute(dask.delayed(len)([1, 2]), address, retries=0)
        assert e.value.nothing_read is True
    finally:
        cluster._clients.pop(address, None)
        _end(worker, sched)
