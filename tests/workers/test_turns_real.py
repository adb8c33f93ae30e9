"""Analysts take turns on a real worker (governance.requests.turns): one analyst's backlog
no longer holds another's request behind it. Before, the queue was first in, first out:
a probe's count waited 218 s behind one analyst's 100 grouped quantiles."""

import pytest

from governance.models import Request

from .conftest import ENTRY_POINTS, wait_for


def _post(client, ds, eps):
    r = client.post("/api/requests/", {"dataset": ds.name, "engine": "memory-hog", "kind": "nap",
                                       "params": {"epsilon": eps}}, format="json")
    assert r.status_code == 202, r.content
    return r.json()["id"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker(pool="prefork", PYTHONPATH=ENTRY_POINTS)
def test_a_backlog_does_not_hold_another_analyst_back(real_worker, memory_hog, api, analyst, analyst2,
                                                     make_dataset, grant):
    ds = make_dataset(epsilon=20.0)
    grant(analyst, ds)
    grant(analyst2, ds)
    backlog = [_post(api(analyst), ds, 0.1 + i / 100) for i in range(8)]
    late = _post(api(analyst2), ds, 0.5)
    ids = [*backlog, late]
    wait_for(lambda: Request.objects.filter(pk__in=ids, status="succeeded").count() == len(ids), timeout=120)
    order = [str(pk) for pk in Request.objects.filter(pk__in=ids).order_by("started_at").values_list("pk", flat=True)]
    # first in, first out it ran last; taking turns, right after the backlog's run under way
    assert order.index(late) <= 2, order
    assert order[:1] == backlog[:1] and [pk for pk in order if pk != late] == backlog  # the backlog in its order
    # a prefork pool's child records its worker's process, whose liveness record vouches for the run
    from governance.core.liveness import process_key

    assert set(Request.objects.filter(pk__in=ids).values_list("worker_process", flat=True)) == {
        process_key(real_worker.process.pid)}
