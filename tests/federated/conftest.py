"""Real Flower processes on localhost: a SuperLink per test, site agents (SuperNodes) on
free ports, every process stopped (its whole process group) in the teardown."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engines.federated import processes


class Cluster:
    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.procs: dict[str, subprocess.Popen] = {}
        self.superlink, self.address = processes.start_superlink(tmp_path)

    def start_site(self, name: str, table, *, site: str | None = None, dataset: str = "clinics",
                   key: str | None = None, misbehave: str = "") -> subprocess.Popen:
        site = site or name
        cmd = [sys.executable, "-m", "engines.federated.site", "--superlink", self.address, "--table", str(table),
               "--dataset", dataset, "--site", site, "--key", key or f"key-{site}", "--insecure",
               "--workdir", str(self.tmp / f"agent-{name}")]
        if misbehave:
            cmd += ["--misbehave", misbehave]
        log = open(self.tmp / f"agent-{name}.log", "wb")
        p = subprocess.Popen(cmd, cwd=processes.REPO, env=processes.env(self.tmp / "home"), stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = p
        return p

    def kill_site(self, name: str) -> None:
        import os
        import signal

        os.killpg(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait(10)

    def close(self) -> None:
        for p in self.procs.values():
            processes.stop(p)
        processes.stop(self.superlink)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()
