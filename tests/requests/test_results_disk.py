"""The results disk on a real filesystem: a tmpfs mounted as RESULTS_DIR, then filled,
then made read-only. A run that would write files finds out before the read (refunded),
not after training (charged). Needs root and mount(8); skipped without them."""

import os
import subprocess

import pytest

from governance.models import Request

from .test_requests_api import post

pytestmark = pytest.mark.django_db


@pytest.fixture
def tmpfs(tmp_path):
    mnt = tmp_path / "results"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def clinic(make_dataset, analyst, grant):
    ds = make_dataset(epsilon=5.0)
    grant(analyst, ds)
    return ds


def run(api, analyst, callbacks_fixture, epsilon):
    with callbacks_fixture(execute=True):  # each its own epsilon: the same question twice is a free replay
        rid = post(api(analyst), {"epsilon": epsilon}, kind="file").json()["id"]
    return Request.objects.get(pk=rid)


def test_a_full_then_read_only_results_disk_is_a_refund_before_the_read(api, analyst, clinic, settings, tmpfs,
                                                                        django_capture_on_commit_callbacks):
    settings.RESULTS_DIR = tmpfs
    settings.RESULTS_MIN_FREE_MB = 1
    first = run(api, analyst, django_capture_on_commit_callbacks, 0.1)
    assert first.status == "succeeded", first.error
    with open(tmpfs / "filler", "wb", buffering=0) as f:  # the disk fills up (another tenant, a log)
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    full = run(api, analyst, django_capture_on_commit_callbacks, 0.2)
    assert (full.status, full.error["code"], full.data_read) == ("failed", "request.failed_before_read", False)
    assert "RESULTS_MIN_FREE_MB" in full.error["detail"] and full.ledger_entry.status == "released"

    (tmpfs / "filler").unlink()
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    read_only = run(api, analyst, django_capture_on_commit_callbacks, 0.3)
    assert (read_only.status, read_only.error["code"]) == ("failed", "request.failed_before_read")
    assert "read-only" in read_only.error["detail"] and read_only.ledger_entry.status == "released"
    assert "Errno" not in full.error["detail"] + read_only.error["detail"]  # the words, not Python's spelling


def test_an_os_error_is_told_in_its_words_without_paths():
    """An analyst read "[Errno 30] Read-only file system: '/srv/results/...'" (a probe)."""
    import errno

    from governance.requests.execution import no_paths

    said = no_paths(OSError(errno.EROFS, "Read-only file system", "/srv/results/.scratch/x"))
    assert said == "Read-only file system"
    assert no_paths(ValueError("bad file /srv/data/t.csv")) == "bad file <a server path>"


def test_a_killed_run_s_scratch_files_are_removed_when_a_process_starts_its_first_run(settings):
    """kill -9 (or the hard time limit) in a synthesis's reports left synthetic.csv and
    synthetic.parquet in .scratch/<host>-<dead pid>-<thread>/ for good (probe AF)."""
    import os
    import socket
    import subprocess
    import sys
    import threading

    from governance.requests import execution

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    base = settings.RESULTS_DIR / ".scratch"
    host = socket.gethostname()
    left = base / f"{host}-{int(dead.stdout)}-1234"
    mine = base / f"{host}-{os.getpid()}-99"  # another thread of this process: alive
    elsewhere = base / f"other-host-{int(dead.stdout)}-1"  # another host's: not judged here
    for d in (left, mine, elsewhere):
        d.mkdir(parents=True)
        (d / "synthetic.csv").write_text("rows")
    got = {}
    t = threading.Thread(target=lambda: got.update(path=execution.scratch_dir()))  # a thread's first run
    t.start()
    t.join()
    assert not left.exists() and mine.exists() and elsewhere.exists() and got["path"].is_dir()


def test_a_runs_files_are_the_services_own(settings):
    """A probe: the officer's reports on the private rows and the released files were
    readable by any account on the host (0644 files in 0755 directories under umask 022).
    A run's directory, which becomes the request's results directory, is 0700, also one
    made before."""
    import stat

    from governance.requests import execution

    path = execution.scratch_dir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    path.chmod(0o755)
    again = execution.scratch_dir()
    assert again == path and stat.S_IMODE(again.stat().st_mode) == 0o700
