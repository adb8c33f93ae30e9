"""Lists cost the same number of SQL statements whatever their length (a probe's year of
metadata: 2,000 accounts made the token page 4,006 statements and 22 s, 1,000 analysts
1,004, 500 datasets 506): each row's role, token and non-private releases come with the
list's own query, not one query a row."""

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext

from governance.core import roles
from governance.ledger import actions as ledger
from governance.models import Dataset

pytestmark = pytest.mark.django_db


def _accounts(django_user_model, start: int, n: int) -> None:
    auditors = Group.objects.get_or_create(name=roles.AUDITORS_GROUP)[0]
    for i in range(start, start + n):
        u = django_user_model.objects.create_user(f"user{i:03d}")
        if i % 3 == 0:
            u.groups.add(auditors)
        if i % 2 == 0:
            from rest_framework.authtoken.models import Token

            Token.objects.create(user=u)


def _statements(call) -> int:
    call()  # once first: a client's own first statements (its token, its session) are not the list's
    with CaptureQueriesContext(connection) as q:
        r = call()
    assert r.status_code == 200, r.content[:300]
    return len(q.captured_queries)


def test_the_account_lists_do_not_query_each_row(api, client, officer, django_user_model):
    client.force_login(officer)
    counts = []
    for start, n in ((0, 4), (4, 20)):
        _accounts(django_user_model, start, n)
        officer_api = api(officer)
        counts.append((_statements(lambda: officer_api.get("/api/analysts/?page_size=1000")),
                       _statements(lambda: client.get("/admin/governance/token/"))))
    assert counts[0] == counts[1], counts
    roles_seen = {a["username"]: a["role"] for a in api(officer).get("/api/analysts/?page_size=1000").json()["results"]}
    assert roles_seen["user003"] == "auditor" and roles_seen["user004"] == "analyst"
    page = client.get("/admin/governance/token/").content.decode()
    assert "user003</td><td>auditor" in page and "user004</td><td>analyst" in page


def test_the_dataset_list_counts_non_private_releases_in_its_own_query(api, officer, make_dataset):
    counts = []
    for names in (["a1"], ["b1", "b2", "b3", "b4", "b5"]):
        for name in names:
            ds = make_dataset(name, epsilon=5.0)
            Dataset.objects.filter(pk=ds.pk).update(allow_non_private=True)
            ledger.charge(ds, officer, {"kind": "non_private"})
        officer_api = api(officer)
        counts.append(_statements(lambda: officer_api.get("/api/datasets/?page_size=1000")))
    assert counts[0] == counts[1], counts
    listed = api(officer).get("/api/datasets/?page_size=1000").json()["results"]
    assert {d["name"]: d["budget"]["non_private_releases"] for d in listed} == {n: 1 for n in ["a1", "b1", "b2", "b3",
                                                                                              "b4", "b5"]}
