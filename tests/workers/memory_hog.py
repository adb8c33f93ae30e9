"""A test engine (never a release engine) that a real worker loads by its entry point
(``tests/workers/entry_points`` on the worker's PYTHONPATH): ``hog`` allocates 300 MB,
keeps it, and fails with MemoryError after reading the data, as a run that asked for more
than the host has; ``pid`` answers which process ran it and how much it holds; ``stuck``
blocks the soft time limit's signal and sleeps, as a run inside one long native call the
soft limit cannot interrupt (an aggregate inside one OpenDP call); ``nap`` takes half a
second and answers as ``pid`` does."""

import os
import signal
import time

import numpy as np

from engines.hookspecs import hookimpl
from engines.types import Release
from tests.requests.conftest import ProbeEngine

HELD: list[np.ndarray] = []  # what a failed run left behind in its process


class MemoryHog(ProbeEngine):  # (its plan: a Laplace event of the request's epsilon)
    NAME = "memory-hog"

    @hookimpl
    def engine_info(self):
        return {"name": self.NAME, "kinds": ["hog", "pid", "stuck", "nap"], "queue": "cpu", "description": "test engine",
                "params_schema": {}}

    @hookimpl
    def run(self, engine, request, dataset, data, plan, progress, workdir):
        if engine != self.NAME:
            return None
        if request.kind == "nap":  # a run that takes a while
            time.sleep(0.5)
        if request.kind == "stuck":
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])  # billiard's soft time limit
            time.sleep(3600)
        if request.kind == "hog":
            HELD.append(np.ones(300 * 2**20 // 8))
            raise MemoryError("Unable to allocate 8.00 TiB for an array")
        return Release(result={"pid": os.getpid(), "held_mb": sum(a.nbytes for a in HELD) // 2**20})


ENGINE = MemoryHog()
