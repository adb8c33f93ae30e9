"""A federated run from the engine's side (the Celery worker): submit the Flower App to the
SuperLink with ``flwr run``, follow the ServerApp's progress file, stop it on a cancel.

The job directory (0700, removed after the run; one a killed worker left is removed, its
Flower run stopped, when the next run starts: ``sweep_orphans``) holds ``job.json`` with
the plan's details and the registered sites' secrets (never in the plan, never in Flower's
run config, which names only the directory), ``progress.jsonl`` and ``result.json``
written by the ServerApp, and ``cancel``, which the engine creates when ``progress``
raises ``Cancelled``: the ServerApp finishes the round under way and stops. The release then charges the rounds and
evaluations done (``Cancelled.actual_event``), as the DP-SGD engine charges its steps.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from engines.types import Cancelled, EngineError, EngineRequest, Plan, Release

from . import planner, processes
from .types import Federation

APP_DIR = Path(__file__).resolve().parent / "flwrapp"
JOB_PREFIX = "federated-job-"
SUBMIT_TIMEOUT = 120.0
CANCEL_WAIT = 300.0
# After the workers' soft time limit the hard one comes (300 s later by default) and kills
# the process: the run is stopped on the SuperLink after a short wait for the round under
# way (the stop itself takes up to 60 s). Waiting CANCEL_WAIT there, a probe's run was
# killed by the hard limit, ended worker_lost and charged in full.
LIMIT_WAIT = 15.0
QUIET_MARGIN = 60.0  # seconds past the longest a run may be silent (sites awaited, three round timeouts)
REPORT_AGAIN = 2.0  # seconds: the last progress is reported again, so a cancel is heard between rounds
UNKNOWN_CHECKS = 3  # after a quiet spell, this many status checks the SuperLink does not answer end the run
UNKNOWN_RETRY = 20.0  # seconds between those checks


class FederatedRunError(EngineError):
    code = "federated.failed"


def _flwr_home(jobdir: Path, fed: Federation) -> Path:
    home = jobdir / "flwr"
    home.mkdir()
    lines = ['[superlink]', 'default = "service"', '', '[superlink.service]', f'address = "{fed.superlink}"']
    lines.append("insecure = true" if fed.insecure else f'root-certificates = "{fed.root_certificates}"')
    (home / "config.toml").write_text("\n".join(lines) + "\n")
    return home


def submit(jobdir: Path, fed: Federation) -> str:
    home = _flwr_home(jobdir, fed)
    cmd = [str(processes.BIN / "flwr"), "run", str(APP_DIR), "service", "--run-config", f'job="{jobdir}"',
           "--format", "json"]
    out = subprocess.run(cmd, env=processes.env(home), capture_output=True, text=True, timeout=SUBMIT_TIMEOUT)
    try:
        res = json.loads(out.stdout[out.stdout.index("{"):])
    except ValueError:
        res = {}
    if out.returncode != 0 or not res.get("success"):
        raise FederatedRunError(f"flwr run failed ({out.returncode}): {(out.stdout + out.stderr)[-800:]}")
    return str(res["run-id"])


def sweep_orphans() -> list[str]:
    """Job directories of runs whose worker died (killed: its ``finally`` never ran) on this
    host: their Flower run is stopped and the directory, with the sites' secrets, removed.
    Called as each run starts; returns the directories removed."""
    removed = []
    for jobdir in Path(tempfile.gettempdir()).glob(JOB_PREFIX + "*"):
        try:
            owner = json.loads((jobdir / "owner").read_text())
            if owner.get("host") != socket.gethostname() or _alive(int(owner["pid"])):
                continue
            run_id = (jobdir / "run_id").read_text().strip() if (jobdir / "run_id").exists() else ""
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not ours, or being written
        _stop(jobdir, run_id)
        shutil.rmtree(jobdir, ignore_errors=True)
        removed.append(str(jobdir))
    return removed


def _stop(jobdir: Path, run_id: str) -> None:
    """``flwr stop`` the run (a ServerApp that would otherwise train its remaining rounds)."""
    if run_id.isdigit() and (jobdir / "flwr").is_dir():
        try:
            subprocess.run([str(processes.BIN / "flwr"), "stop", run_id, "service"],
                           env=processes.env(jobdir / "flwr"), capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            pass  # the SuperLink may be gone too


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_status(jobdir: Path, run_id: str) -> str:
    cmd = [str(processes.BIN / "flwr"), "ls", "service", "--run-id", run_id, "--format", "json"]
    out = subprocess.run(cmd, env=processes.env(jobdir / "flwr"), capture_output=True, text=True, timeout=60)
    try:
        runs = json.loads(out.stdout[out.stdout.index("{"):]).get("runs", [])
        return runs[0]["status"] + (f" ({runs[0].get('status-details')})" if runs[0].get("status-details") else "")
    except (ValueError, IndexError, KeyError):
        return "unknown"


def _round_progress(d: dict, ev: dict) -> dict:
    rounds = d["spec"]["rounds"]
    return {"phase": "training", "fraction": round(min(ev["round"] / rounds, 0.99), 4), "round": ev["round"],
            "rounds": rounds, "epsilon_spent": ev.get("epsilon"), "sites": ev.get("sites"), "eval": ev.get("eval")}


def check_version(plan: Plan) -> dict:
    d = plan.details_of("federated", planner.DETAILS_VERSION)
    return d


def execute(request: EngineRequest, dataset, fed: Federation, plan: Plan, progress, workdir=None) -> Release:
    d = check_version(plan)
    if not isinstance(fed, Federation):
        raise EngineError("a federated dataset runs on its sites: run() needs a Federation, not a table")
    sweep_orphans()
    jobdir = Path(tempfile.mkdtemp(prefix=JOB_PREFIX))
    os.chmod(jobdir, 0o700)
    try:
        (jobdir / "owner").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
        (jobdir / "job.json").write_text(json.dumps({
            "details": d, "site_keys": {s: k for s, k in fed.site_keys.items() if s in d["spec"]["sites"]},
            "wait_sites_seconds": fed.wait_sites_seconds, "round_timeout": fed.round_timeout,
            "min_sites": fed.min_sites}))
        os.chmod(jobdir / "job.json", 0o600)  # the sites' secrets (the directory is 0700 too)
        progress({"phase": "submitting", "fraction": 0.0})
        run_id = submit(jobdir, fed)
        (jobdir / "run_id").write_text(run_id)
        state: dict = {"rounds": 0, "evals": 0}
        try:
            return _follow(d, jobdir, run_id, fed, progress, Path(workdir) if workdir else None, state)
        except (Cancelled, EngineError):
            raise
        except BaseException as e:  # the worker's time limit, a signal: stop the ServerApp too, charge its rounds
            if not (jobdir / "result.json").exists():  # (else the sites would train on after the request ended)
                e.actual_event = _cancel(d, jobdir, run_id, state["rounds"], state["evals"], wait=LIMIT_WAIT)
            raise
    finally:
        shutil.rmtree(jobdir, ignore_errors=True)


def _follow(d: dict, jobdir: Path, run_id: str, fed: Federation, progress, workdir: Path | None,
            state: dict | None = None) -> Release:
    """Forward the run's progress until its result; ``state`` holds the rounds and evaluations
    seen (for a charge when the run is stopped from outside)."""
    state = {} if state is None else state
    state.update({"seen": 0, "rounds": 0, "evals": 0, "last": time.monotonic(), "said": None,
                  "told": time.monotonic(), "unknown": 0})
    quiet = fed.wait_sites_seconds + 3 * fed.round_timeout + QUIET_MARGIN
    result_path = jobdir / "result.json"

    def say(update: dict) -> None:
        """Report; a cancel (raised by ``progress``) asks the ServerApp to stop."""
        state["said"], state["told"] = update, time.monotonic()
        try:
            progress(update)
        except Cancelled as c:
            c.actual_event = _cancel(d, jobdir, run_id, state["rounds"], state["evals"])
            raise

    def drain() -> None:
        """Forward the ServerApp's new progress lines (a cancel raised here stops the run)."""
        path = jobdir / "progress.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        complete = lines if not lines or path.read_text().endswith("\n") else lines[:-1]
        for line in complete[state["seen"]:]:
            state["seen"] += 1
            state["last"] = time.monotonic()
            ev = json.loads(line)
            if ev.get("event") == "round":
                state["rounds"], state["evals"] = ev["round"], ev.get("evals", state["evals"])
                say(_round_progress(d, ev))
            elif ev.get("event") in ("sites", "refused", "identified"):
                say({"phase": "sites", "fraction": 0.0, **{k: v for k, v in ev.items() if k != "event"}})

    while not result_path.exists():
        drain()
        if state["said"] is not None and time.monotonic() - state["told"] > REPORT_AGAIN:
            say(state["said"])  # between rounds too, so that a cancel is heard within seconds
        if time.monotonic() - state["last"] > quiet:
            status = run_status(jobdir, run_id)
            state["unknown"] = state["unknown"] + 1 if status == "unknown" else 0
            if status.startswith("finished") or state["unknown"] >= UNKNOWN_CHECKS:
                break  # ended, or the SuperLink no longer answers: the run cannot finish
            # running (sites slow to come): wait another quiet spell; unknown: ask again soon
            state["last"] = time.monotonic() - (quiet - UNKNOWN_RETRY if status == "unknown" else 0)
        time.sleep(0.2)
    if not result_path.exists():
        status = run_status(jobdir, run_id)
        err = FederatedRunError(f"the ServerApp ended without a result: {status}"
                                + (" (the SuperLink does not answer)" if status == "unknown" else ""))
        # the SuperLink silent: the rounds reported (no later update could reach the ServerApp);
        # the ServerApp ended without its result (killed, out of memory): those and the one
        # that may have been under way. With no round reported this was the whole plan (a
        # probe's ServerApp killed in round 1 of 4 charged all four)
        done = (state["rounds"], state["evals"])
        err.actual_event = planner.rounds_event(d, *done) if status == "unknown" else _one_more(d, *done)
        raise err
    drain()
    result = json.loads(result_path.read_text())
    return _release(d, result, workdir, run_id)


def _cancel(d: dict, jobdir: Path, run_id: str, rounds: int, evals: int, wait: float | None = None) -> dict:
    """Ask the ServerApp to stop; the event of what it really did (a round may be under way).
    The time limit (or a signal) during the wait for the round stops the run at once: the
    analyst's cancel stays a cancel (a probe's, asked 27 s before the soft limit, ended as a
    time-limit failure after a second wait, charged a round run after it)."""
    (jobdir / "cancel").touch()
    deadline = time.monotonic() + (CANCEL_WAIT if wait is None else wait)
    try:
        while time.monotonic() < deadline and not (jobdir / "result.json").exists():
            time.sleep(0.2)
    except Exception:  # noqa: BLE001 - the soft time limit: the run is stopped now, below
        pass
    except BaseException:  # a signal (the process is going): stop the run, then go
        _stop(jobdir, run_id)
        raise
    if (jobdir / "result.json").exists():
        r = json.loads((jobdir / "result.json").read_text())
        return planner.rounds_event(d, r["rounds"], r["evals"])
    # no answer (a round longer than the wait): stop the run on the SuperLink, else its sites
    # trained every remaining round after the request ended; charge the round that may have
    # been under way as done
    _stop(jobdir, run_id)
    return _one_more(d, rounds, evals)


def _one_more(d: dict, rounds: int, evals: int) -> dict:
    """The event of the rounds (and evaluations) done and the one that may have been under
    way: what a run that ended without its result is charged."""
    return planner.rounds_event(d, min(rounds + 1, d["spec"]["rounds"]),
                                min(evals + 1, d["evals"]) if d["evals"] else 0)


def _release(d: dict, r: dict, workdir: Path | None, run_id: str) -> Release:
    spec = d["spec"]
    if r["stopped"] == "no_sites":
        refused = "; ".join(map(str, r.get("sites", {}).get("refused", {}).values()))
        err = FederatedRunError("no registered site took part (none answered within the wait for sites, or each "
                                "that did was refused before reading its table" +
                                (f": {refused[:500]}" if refused else "") + "): nothing was trained and no site read "
                                "a row")
        err.nothing_read = True  # the host refunds, as for a failure before the read
        raise err
    if r["stopped"] == "failed":
        err = FederatedRunError(f"federated run failed after {r['rounds']} round(s): {r.get('error')}")
        if not r.get("rows_asked", True):  # before any site was sent work: no row was read, refund
            err.nothing_read = True
        else:  # the rounds done and the one that may have been under way
            err.actual_event = _one_more(d, r["rounds"], r["evals"])
        raise err
    if r["stopped"] == "cancelled":
        c = Cancelled("cancelled")
        c.actual_event = planner.rounds_event(d, r["rounds"], r["evals"])
        raise c
    files = {}
    if workdir is not None:
        (workdir / "model.json").write_text(json.dumps({
            "format": "governance.federated/1", "model": "softmax regression", "weights": r["weights"],
            "features": spec["features"], "target": spec["target"], "task": spec["task"]}))
        files["model"] = "model.json"
    last = r["history"][-1] if r["history"] else {}
    result = {"flower_run_id": run_id, "mode": spec["mode"], "stopped": r["stopped"], "rounds": r["rounds"],
              "planned_rounds": spec["rounds"], "epsilon_spent": r["epsilon"], "planned_epsilon": d["planned_epsilon"],
              "noise_multiplier": d["noise_multiplier"], "sample_rate": spec["sample_rate"],
              "clip_norm": spec["clip_norm"], "delta": spec["delta"], "registered_sites": spec["sites"],
              "sites": r["sites"], "history": r["history"], "test": last.get("eval"),
              "eval_ci95_halfwidth": d["eval_ci95_halfwidth"], "weights": r["weights"], **files}
    done = r["rounds"] < spec["rounds"] or r["evals"] < d["evals"]
    return Release(result=result, actual_event=planner.rounds_event(d, r["rounds"], r["evals"]) if done else None)
