"""Following a federated run from the worker (engines/federated/execute.py ``_follow``),
with the ServerApp's files written by the test and ``flwr ls`` replaced: a SuperLink that
dies mid-run ends the run within a bounded time, charged the rounds done (it hung: its
status "unknown" restarted the wait forever, and a cancel was never heard); a cancel is
heard between rounds, not only at the next round's report."""

import json
import threading
import time

import pytest

from engines.federated import execute, planner
from engines.federated.types import Federation
from engines.types import Cancelled

FED = Federation(superlink="127.0.0.1:9", wait_sites_seconds=0.0, round_timeout=0.0)


@pytest.fixture
def details():
    return {"version": planner.DETAILS_VERSION, "evals": 0, "local": False, "sample_rate": 0.5,
            "noise_multiplier": 1.0, "eval_epsilon_each": 0.0,
            "spec": {"rounds": 5, "private": True, "sites": ["h1", "h2"]}}


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(execute, "QUIET_MARGIN", 0.3)
    monkeypatch.setattr(execute, "UNKNOWN_RETRY", 0.05)
    monkeypatch.setattr(execute, "REPORT_AGAIN", 0.05)
    monkeypatch.setattr(execute, "CANCEL_WAIT", 0.2)
    monkeypatch.setattr(planner, "rounds_event", lambda d, rounds, evals: {"rounds": rounds, "evals": evals})


def _round(jobdir, n):
    with open(jobdir / "progress.jsonl", "a") as f:
        f.write(json.dumps({"event": "round", "round": n, "evals": 0, "sites": {"accepted": ["h1"]}}) + "\n")


def test_a_superlink_that_stops_answering_ends_the_run_with_the_rounds_done(tmp_path, details, fast, monkeypatch):
    checks = []
    monkeypatch.setattr(execute, "run_status", lambda jobdir, run_id: checks.append(1) or "unknown")
    _round(tmp_path, 1)
    t0 = time.monotonic()
    with pytest.raises(execute.FederatedRunError, match="SuperLink does not answer") as e:
        execute._follow(details, tmp_path, "7", FED, lambda update: None, None)
    assert time.monotonic() - t0 < 10
    assert e.value.actual_event == {"rounds": 1, "evals": 0}
    assert len(checks) == execute.UNKNOWN_CHECKS + 1  # three checks, then the error's own


def test_a_run_still_running_is_waited_for(tmp_path, details, fast, monkeypatch):
    """A quiet spell (sites slow to come) with the run still listed, or one unanswered check
    between answered ones, does not end it."""
    asked = []
    statuses = iter(["running", "unknown", "running", "unknown", "unknown", "running"])
    monkeypatch.setattr(execute, "run_status", lambda jobdir, run_id: asked.append(1) or next(statuses, "running"))
    monkeypatch.setattr(execute, "_release", lambda d, r, workdir, run_id: r)
    threading.Timer(1.5, lambda: (tmp_path / "result.json").write_text(json.dumps({"rounds": 5}))).start()
    assert execute._follow(details, tmp_path, "7", FED, lambda update: None, None) == {"rounds": 5}
    assert len(asked) >= 4


def test_a_cancel_is_heard_between_rounds(tmp_path, details, fast, monkeypatch):
    monkeypatch.setattr(execute, "run_status", lambda jobdir, run_id: "running")
    reports = []

    def progress(update):
        reports.append(update)
        if len(reports) >= 3:  # the round's report, then the same again while the next round runs
            raise Cancelled("cancelled")

    _round(tmp_path, 1)
    t0 = time.monotonic()
    with pytest.raises(Cancelled) as c:
        execute._follow(details, tmp_path, "7", FED, progress, None)
    assert time.monotonic() - t0 < 5 and (tmp_path / "cancel").exists()
    assert all(r["round"] == 1 for r in reports)
    assert c.value.actual_event == {"rounds": 2, "evals": 0}  # no answer: the round under way is charged


def test_a_cancel_not_answered_in_time_stops_the_run_on_the_superlink(tmp_path, details, fast, monkeypatch):
    """A probe's round longer than CANCEL_WAIT (SecAgg+'s four stages, a large site): the
    request ended, charged, and the ServerApp trained every remaining round, its sites
    reading their rows. The run is stopped (``flwr stop``), and a ServerApp whose job
    directory is gone stops as for a cancel."""
    stopped = []
    monkeypatch.setattr(execute, "_stop", lambda jobdir, run_id: stopped.append(run_id))
    assert execute._cancel(details, tmp_path, "7", 1, 0) == {"rounds": 2, "evals": 0}
    assert stopped == ["7"]


def test_the_soft_time_limit_during_a_cancel_s_wait_stops_the_run_and_keeps_it_a_cancel(tmp_path, details, fast,
                                                                                          monkeypatch):
    """A probe's cancel, asked 27 s before the soft limit, waited for the round; the limit
    raised in that wait, went down the time-limit path and waited CANCEL_WAIT again: the
    request ended a time-limit failure, charged a round run after the cancel. The run is
    stopped at once and the cancel raised as asked."""
    class SoftTimeLimit(Exception):  # Celery's SoftTimeLimitExceeded is an Exception
        pass

    monkeypatch.setattr(execute, "CANCEL_WAIT", 60.0)
    monkeypatch.setattr(execute, "run_status", lambda jobdir, run_id: "running")
    stopped = []
    monkeypatch.setattr(execute, "_stop", lambda jobdir, run_id: stopped.append(run_id))
    real_sleep = time.sleep
    asked = []

    def progress(update):
        asked.append(update)
        raise Cancelled("cancelled")

    def sleep(seconds):
        if (tmp_path / "cancel").exists():
            raise SoftTimeLimit()  # the limit, while the cancel waits for the round
        real_sleep(seconds)

    monkeypatch.setattr(execute.time, "sleep", sleep)
    _round(tmp_path, 1)
    t0 = time.monotonic()
    with pytest.raises(Cancelled) as c:
        execute._follow(details, tmp_path, "7", FED, progress, None)
    assert time.monotonic() - t0 < 5 and stopped == ["7"]
    assert c.value.actual_event == {"rounds": 2, "evals": 0}


def test_a_job_a_killed_worker_left_is_stopped_and_removed(tmp_path, monkeypatch):
    """A worker killed mid-run left its job directory (the sites' secrets, the model) and
    its Flower run going; the next run's start stops and removes it, and only it."""
    import os
    import socket
    import subprocess

    monkeypatch.setattr(execute.tempfile, "gettempdir", lambda: str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()
    stops = []
    monkeypatch.setattr(execute.subprocess, "run", lambda cmd, **kw: stops.append(cmd))

    def job(name, pid, host=None, run_id="42"):
        d = tmp_path / (execute.JOB_PREFIX + name)
        (d / "flwr").mkdir(parents=True)
        (d / "job.json").write_text('{"site_keys": {"h1": "secret"}}')
        (d / "owner").write_text(json.dumps({"pid": pid, "host": host or socket.gethostname()}))
        (d / "run_id").write_text(run_id)
        return d

    orphan = job("orphan", dead.pid)
    mine = job("running", os.getpid())
    elsewhere = job("elsewhere", dead.pid, host="another-host")
    assert execute.sweep_orphans() == [str(orphan)]
    assert not orphan.exists() and mine.exists() and elsewhere.exists()
    assert stops and stops[0][1:4] == ["stop", "42", "service"]


def test_the_worker_s_time_limit_stops_the_serverapp_and_charges_its_rounds(tmp_path, details, fast, monkeypatch):
    """The soft time limit raised while following: the job directory was removed and the
    sites trained all the planned rounds after the request had ended, charged in full
    (probe AH). Now the ServerApp is asked to stop (``cancel``) and the rounds are charged."""
    from celery.exceptions import SoftTimeLimitExceeded

    from engines.types import EngineRequest, Plan

    monkeypatch.setattr(execute, "sweep_orphans", lambda: None)
    monkeypatch.setattr(execute, "submit", lambda jobdir, fed: "7")
    seen = {}

    def follow(d, jobdir, run_id, fed, progress, workdir, state):
        state.update(rounds=2, evals=0)
        seen["jobdir"] = jobdir
        raise SoftTimeLimitExceeded()

    def cancel(d, jobdir, run_id, rounds, evals, wait=None):
        seen["cancel"], seen["wait"] = True, wait
        return {"rounds": rounds + 1, "evals": evals}

    monkeypatch.setattr(execute, "_follow", follow)
    monkeypatch.setattr(execute, "_cancel", cancel)
    fed = Federation(superlink="127.0.0.1:9", site_keys={"h1": "k"}, wait_sites_seconds=0.0, round_timeout=0.0)
    with pytest.raises(SoftTimeLimitExceeded) as e:
        execute.execute(EngineRequest("train", {}), None, fed, Plan(event={}, columns=[], details=details),
                        lambda u: None)
    assert seen["cancel"] and e.value.actual_event == {"rounds": 3, "evals": 0}
    # the hard limit comes 300 s after the soft one by default: a wait of CANCEL_WAIT (300 s)
    # before the stop let it kill the worker (worker_lost, charged in full; a probe)
    assert seen["wait"] == execute.LIMIT_WAIT and execute.LIMIT_WAIT + 60 < 300 / 2


@pytest.mark.parametrize("reported, charged", [(0, 1), (2, 3)])
def test_a_serverapp_that_ends_without_its_result_is_charged_the_rounds_under_way_not_the_plan(
        tmp_path, details, fast, monkeypatch, reported, charged):
    """A probe SIGKILLed ``flwr-serverapp`` in round 1 of 4: the run failed charged the whole
    plan (no round reported: the charge was None). Now the rounds reported and the one that
    may have been under way (engines/federated/README.md), as for any failure of the ServerApp."""
    monkeypatch.setattr(execute, "run_status", lambda jobdir, run_id: "finished:failed")
    for n in range(1, reported + 1):
        _round(tmp_path, n)
    with pytest.raises(execute.FederatedRunError, match="ServerApp ended without a result") as e:
        execute._follow(details, tmp_path, "7", FED, lambda update: None, None)
    assert e.value.actual_event == {"rounds": charged, "evals": 0}
