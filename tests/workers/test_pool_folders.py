"""workers.pool's lock folders: a worker killed with SIGKILL never runs its finalizer, and
its folder stayed in /tmp for good (50 of them on one machine). The next pool removes the
folders of processes no longer running, and only those."""

import os
import subprocess
import sys

from workers.pool import PREFIX, remove_stale_folders


def test_folders_of_dead_processes_are_removed_and_no_other(tmp_path):
    tmp_path = tmp_path / "tmp"
    tmp_path.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = tmp_path / f"{PREFIX}{int(dead.stdout)}-abc"
    mine = tmp_path / f"{PREFIX}{os.getpid()}-def"
    parent = tmp_path / f"{PREFIX}{os.getppid()}-ghi"  # alive
    old_style = tmp_path / f"{PREFIX}x1y2z3"  # no pid in its name: not judged
    other = tmp_path / "something-else"
    for d in (gone, mine, parent, old_style, other):
        d.mkdir()
        (d / "tasks.lock").touch()
    assert remove_stale_folders(str(tmp_path)) == [gone.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(d.name for d in (mine, parent, old_style, other))
