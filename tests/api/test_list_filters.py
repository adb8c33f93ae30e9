"""A query parameter a list does not take is a 400 naming the filters it takes: django-filter
ignored it, and a probe's officer asked ``/api/requests/?analyst__username=bob`` and was
answered every request, bob's or not."""

import pytest

from governance.ledger import actions as ledger

from .conftest import assert_error

pytestmark = pytest.mark.django_db


def test_an_unknown_filter_on_a_list_is_a_400_not_the_whole_list(api, officer, analyst, make_dataset, grant):
    ds = make_dataset("clinic", epsilon=5.0)
    grant(analyst, ds)
    ledger.commit(ledger.admit(ds, analyst, {"kind": "laplace", "epsilon": 0.1}).pk)
    client = api(officer)
    body = assert_error(client.get("/api/requests/?analyst__username=bob"), 400, "request.invalid")
    assert "'analyst__username'" in body["detail"] and "dataset__name" in body["detail"], body
    assert body["errors"] == {"analyst__username": "not a filter of this list"}
    assert_error(client.get("/api/datasets/?statuss=active"), 400, "request.invalid")
    assert_error(client.get("/api/requests/?wait=NaN"), 400, "request.invalid")  # lists take no wait
    # the filters a list takes, paging and ordering answer as before
    assert [e["analyst"] for e in client.get("/api/ledger/?analyst__username=" + analyst.username).json()[
        "results"]] == [analyst.username]
    assert client.get("/api/ledger/?analyst__username=nobody").json()["results"] == []
    assert client.get("/api/datasets/?status=active&page=1&page_size=5&ordering=name").status_code == 200
    assert client.get("/api/audit/?dataset__name=clinic&at__gte=2020-01-01T00:00:00Z").status_code == 200
    # a detail route is no list: its own parameters are its own (?wait= on a request)
    assert client.get(f"/api/ledger/{ds.ledger.first().pk}/?format=json").status_code == 200
