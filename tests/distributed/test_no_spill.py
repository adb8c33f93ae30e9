"""No row reaches a Dask worker's disk: Dask spills task results past 60% of a worker's
memory into its local directory and deletes them only when the run releases them, which a
killed host never does (a helper's probe left 72 files of unit ids and values on a killed
400 MB worker). The engine's client puts ``NoSpill`` on every worker of its cluster."""

import numpy as np

from engines.distributed import cluster


def _stored(tmp_path) -> list:
    return [p for p in tmp_path.rglob("*") if p.is_file() and "storage" in p.parts]


def test_the_engines_cluster_keeps_results_in_memory_never_on_disk(tmp_path):
    from distributed import Client, LocalCluster, wait

    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="1GB", local_directory=str(tmp_path),
                      dashboard_address=None, host="127.0.0.1") as lc, Client(lc.scheduler_address) as plain:
        big = plain.submit(np.ones, 80_000_000, pure=False)  # 640 MB: past the 60% target
        wait(big)  # (not result(): the array stays on the worker)
        assert _stored(tmp_path), "Dask's default spills it (the control)"
        big.release()
        del big
        c = cluster.client(lc.scheduler_address)
        try:
            kept = c.submit(np.ones, 80_000_000, pure=False)
            wait(kept)
            assert not _stored(tmp_path)
            fractions = c.run(lambda dask_worker: (dask_worker.memory_manager.memory_spill_fraction,
                                                   dask_worker.data.n))
            assert all(f is False and n == float("inf") for f, n in fractions.values())
            kept.release()
        finally:
            c.close()
            cluster._clients.pop(lc.scheduler_address, None)
