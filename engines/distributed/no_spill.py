"""A Dask worker plugin the engine registers on every cluster it uses (``cluster.client``)."""

from __future__ import annotations

import math

from distributed.diagnostics.plugin import WorkerPlugin


class NoSpill(WorkerPlugin):
    """A worker plugin: the worker keeps task results in memory, never spilled to its disk.
    The unit buckets' pieces are rows (unit ids and values); Dask spills results past 60%
    of a worker's memory into its local directory and deletes them when the run releases
    them, which a killed host never does (a probe's 400 MB worker left 72 files of ids and
    values). A worker short of memory pauses instead (``compute`` waits, then fails the
    run), and one past 95% is restarted by its nanny (its tasks recomputed elsewhere)."""

    name = "privacy-governance-no-spill"
    idempotent = True  # registered by every process's client: set up once per worker

    def setup(self, worker) -> None:
        from distributed.spill import SpillBuffer

        worker.memory_manager.memory_target_fraction = False
        worker.memory_manager.memory_spill_fraction = False
        if isinstance(worker.data, SpillBuffer):
            worker.data.n = math.inf  # no result is moved to the slow (disk) mapping
