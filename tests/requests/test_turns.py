"""Analysts take turns (governance.requests.turns): a worker's message runs the fairest
queued request of its queue, not necessarily its own. Before, the queue was first in,
first out, and one analyst's backlog held every other analyst's request behind it (a
probe's count waited 218 s behind 100 grouped quantiles). Here the messages are run by
hand, one worker, in the order they were sent, as a worker takes them."""

import pytest

from engines import plugins
from engines.hookspecs import hookimpl
from governance.models import Request
from governance.requests import execution, recovery, submission, turns

from .conftest import ProbeEngine

URL = "/api/requests/"


class GpuProbe(ProbeEngine):
    NAME = "probe-gpu"

    @hookimpl
    def engine_info(self):
        return {"name": self.NAME, "kinds": ["count"], "queue": "gpu", "description": "test engine",
                "params_schema": {}}


@pytest.fixture
def sent(monkeypatch):
    """The messages sent, in order (no worker takes them)."""
    out = []
    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: out.append((str(pk), queue)))
    return out


@pytest.fixture
def gpu_engine():
    engine = GpuProbe()
    plugins.pm.register(engine, name="probe-gpu-engine")
    yield engine
    plugins.pm.unregister(engine)


@pytest.fixture
def clinic(make_dataset, grant, analyst, analyst2, django_user_model):
    carl = django_user_model.objects.create_user("carl")
    ds = make_dataset("clinic", epsilon=20.0)
    for who in (analyst, analyst2, carl):
        grant(who, ds)
    return ds, carl


@pytest.fixture
def ask(api, django_capture_on_commit_callbacks):
    def post(who, eps, engine="probe"):
        with django_capture_on_commit_callbacks(execute=True):  # the message is sent as the POST commits
            r = api(who).post(URL, {"dataset": "clinic", "engine": engine, "kind": "count",
                                    "params": {"epsilon": eps}}, format="json")
        assert r.status_code == 202, r.content
        return r.json()["id"]
    return post


def take(sent):
    """One worker takes every message in the order sent; returns the requests run, in order."""
    ran = []
    for i, (pk, _queue) in enumerate(sent):
        before = set(Request.objects.filter(status="succeeded").values_list("pk", flat=True))
        execution.execute(pk, worker="w1", task=f"task-{i}", take_turns=True)
        now = set(Request.objects.filter(status="succeeded").values_list("pk", flat=True))
        ran += [str(pk) for pk in now - before]
    return ran


@pytest.mark.django_db
def test_a_backlog_does_not_hold_other_analysts_back(clinic, sent, ask, api, analyst, analyst2):
    _, carl = clinic
    ann = [ask(analyst, 0.1 + i / 100) for i in range(4)]
    bob = ask(analyst2, 0.2)
    carl_req = ask(carl, 0.3)
    ran = take(sent)
    # round robin: ann's first, then the two who were never served, then ann's backlog in order
    assert ran == [ann[0], bob, carl_req, ann[1], ann[2], ann[3]]
    assert Request.objects.filter(status="succeeded").count() == 6


@pytest.mark.django_db
def test_an_analyst_with_a_run_under_way_waits_for_one_without(clinic, sent, ask, api, analyst, analyst2):
    ann = [ask(analyst, 0.1 + i / 100) for i in range(2)]
    bob = ask(analyst2, 0.2)
    assert execution.claim(ann[0], "w2") is not None  # another worker runs ann's first
    engines = turns.queue_engines("probe")
    assert turns.fairest(engines) == bob
    assert execution.claim(bob, "w3") is not None
    assert turns.fairest(engines) == ann[1]  # one each running: the least recently served, ann
    Request.objects.filter(pk__in=[ann[0], bob]).update(status="succeeded")


@pytest.mark.django_db
def test_a_turn_whose_request_ended_runs_the_next(clinic, sent, ask, api, analyst):
    first, second = ask(analyst, 0.1), ask(analyst, 0.2)
    assert api(analyst).post(f"{URL}{first}/cancel/").status_code == 200
    assert execution.execute(first, worker="w1", task="t1", take_turns=True) == "succeeded"
    assert Request.objects.get(pk=second).status == "succeeded"
    # the second's own message finds nothing queued: it changes nothing
    assert execution.execute(second, worker="w1", task="t2", take_turns=True) == "succeeded"
    assert Request.objects.get(pk=first).status == "cancelled"


@pytest.mark.django_db
def test_a_turn_runs_only_its_own_queue(clinic, sent, ask, api, analyst, analyst2, gpu_engine):
    gpu = ask(analyst, 0.1, engine="probe-gpu")
    cpu = ask(analyst2, 0.2)
    assert [q for _, q in sent] == ["gpu", "cpu"]
    execution.execute(cpu, worker="w1", task="t1", take_turns=True)
    assert Request.objects.get(pk=gpu).status == "queued" and Request.objects.get(pk=cpu).status == "succeeded"
    assert turns.fairest(turns.queue_engines("probe")) is None
    assert turns.fairest(turns.queue_engines("probe-gpu")) == gpu


@pytest.mark.django_db
def test_the_hard_time_limit_finds_the_run_by_its_turn(clinic, sent, ask, api, analyst, analyst2, settings):
    """A turn's task may run another request than its message's: the hard time limit's
    handler finishes the one that task claimed, never the message's own."""
    ann = ask(analyst, 0.1)
    bob = ask(analyst2, 0.2)
    req = execution.claim_turn(bob, "w1", task="bobs-message")
    assert str(req.pk) == ann  # ann's waited longest: bob's message runs it
    assert recovery.finish_killed_by_time_limit("bobs-message", 60) == ann
    got = Request.objects.get(pk=ann)
    assert got.status == "failed" and got.error["code"] == "request.time_limit"
    assert Request.objects.get(pk=bob).status == "queued"
    assert recovery.finish_killed_by_time_limit("bobs-message", 60) is None  # once
