"""A scheduler that cannot read a run's graph (its Python environment lacks this code, or
has other versions: an image older than the Celery worker's) ran none of its tasks. A
probe found such runs charged as ``failed_after_read`` (distributed's RuntimeError was taken
for a failure of the data) and a registration answered with an HTML 500. Now it is
``ClusterUnavailable``: nothing read when it is the run's first graph (refunded), and a
registration's 503."""

import dask
import pytest

from engines.distributed import cluster as dc


def _unreadable():
    raise ModuleNotFoundError("No module named 'engines' (a scheduler without this code)")


class Unreadable:
    """Pickles, but unpickling it (on the scheduler) fails, as a graph of a module the
    scheduler's environment does not have does."""

    def __reduce__(self):
        return (_unreadable, ())


def _one(_):
    return 1


@pytest.fixture
def fresh_thread():
    dc.take_submitted()
    yield
    dc.take_submitted()


def test_a_graph_the_scheduler_cannot_read_is_the_cluster_unavailable_not_the_data(dask_cluster, fresh_thread):
    with pytest.raises(dc.ClusterUnavailable) as e:
        dc.compute(dask.delayed(_one)(Unreadable()), dask_cluster, retries=0)
    assert e.value.nothing_read is True and dc.lost(e.value)
    assert "could not read the run's graph" in str(e.value)
    # a later graph of the same run: an earlier one may have read rows
    assert dc.compute(dask.delayed(_one)(0), dask_cluster, retries=0) == 1
    with pytest.raises(dc.ClusterUnavailable) as e:
        dc.compute(dask.delayed(_one)(Unreadable()), dask_cluster, retries=0)
    assert e.value.nothing_read is False


def test_a_task_that_fails_on_a_worker_is_still_the_datas_failure(dask_cluster, fresh_thread):
    def bad(_):
        raise RuntimeError("a value the engine refuses")

    with pytest.raises(RuntimeError, match="refuses"):
        dc.compute(dask.delayed(bad)(0), dask_cluster, retries=0)
