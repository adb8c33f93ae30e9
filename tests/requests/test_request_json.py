"""The request views render with ``serializers.request_json``, a written-out
``RequestSerializer`` (which stays the OpenAPI schema and the list's renderer): the two
give the same bytes for every state of a request and every viewer."""

import pytest
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request as DRFRequest
from rest_framework.test import APIRequestFactory

from governance.api.serializers import RequestSerializer, request_json
from governance.models import Request

pytestmark = pytest.mark.django_db
URL = "/api/requests/"


def post(client, params, kind="count"):
    return client.post(URL, {"dataset": "clinic", "engine": "probe", "kind": kind, "params": params}, format="json")


def test_request_json_renders_what_the_serializer_renders(api, analyst, analyst2, officer, make_dataset, grant,
                                                          django_capture_on_commit_callbacks):
    ds = make_dataset(epsilon=1.0)
    grant(analyst, ds)
    client = api(analyst)
    with django_capture_on_commit_callbacks(execute=True):
        done = post(client, {"epsilon": 0.25}).json()["id"]
        failed = post(client, {"epsilon": 0.1}, kind="fail").json()["id"]
    replay = post(client, {"epsilon": 0.25})
    assert replay.status_code == 200
    with django_capture_on_commit_callbacks(execute=False):
        queued = post(client, {"epsilon": 0.05}).json()["id"]
        cancelled = post(client, {"epsilon": 0.06}).json()["id"]
    assert client.post(f"{URL}{cancelled}/cancel/").status_code == 200
    rows = Request.objects.select_related("dataset", "analyst", "ledger_entry")
    states = {r.status for r in rows} | {"replayed" for r in rows if r.replay_of_id}
    assert states == {"succeeded", "failed", "queued", "cancelled", "replayed"}
    factory, render = APIRequestFactory(), JSONRenderer().render
    for req in rows:
        for user in (analyst, analyst2, officer):
            for method in ("get", "post"):
                http = DRFRequest(getattr(factory, method)(URL))
                http.user = user
                expected = render(RequestSerializer(req, context={"request": http}).data)
                assert render(request_json(req, http)) == expected, (req.status, user.username, method)
    shown = client.get(f"{URL}{done}/").json()
    assert shown["result"] == {"rows": 200} and "refined_epsilon" in shown["charge"]["rdp"]
    assert api(officer).get(f"{URL}{failed}/").json()["result"] is None
    assert client.get(f"{URL}{queued}/").json()["charge"]["ledger_status"] == "reserved"
