"""Client.wait alone (a stub session, no server): backoff against a service that answers at
once, no extra sleep against one that holds the answer (``?wait=``), the timeout."""

from __future__ import annotations

import pytest

from privacy_client import Backoff, Client, RequestFailed, WaitTimeout


class Answer:
    def __init__(self, body):
        self.body, self.status_code, self.content, self.headers = body, 200, b"x", {}

    def json(self):
        return self.body


class StubSession:
    """Answers GET /api/requests/r1/ with the given statuses in turn; each read 'takes' ``hold``
    seconds of the fake clock when the call asked for ``?wait=``."""

    def __init__(self, statuses, clock, hold=0.0):
        self.statuses, self.clock, self.hold, self.calls, self.headers = list(statuses), clock, hold, [], {}

    def request(self, method, url, params=None, **kw):
        self.calls.append((method, url, params))
        if params and "wait" in params:
            self.clock.now += min(self.hold, float(params["wait"]))
        status = self.statuses.pop(0)
        body = {"id": "r1", "engine": "aggregates", "kind": "count", "status": status, "progress": {}}
        if status == "failed":
            body["error"] = {"code": "request.failed_before_read", "detail": "gone"}
        return Answer(body)


class Clock:
    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def monotonic(self):
        return self.now

    def sleep(self, s):
        self.sleeps.append(round(s, 6))
        self.now += s


@pytest.fixture
def clock(monkeypatch):
    import privacy_client.client as mod

    c = Clock()
    monkeypatch.setattr(mod.time, "monotonic", c.monotonic)
    monkeypatch.setattr(mod.time, "sleep", c.sleep)
    return c


def test_it_backs_off_against_a_service_that_answers_at_once(clock):
    session = StubSession(["queued", "queued", "running", "running", "succeeded"], clock)
    client = Client("http://svc", token="t", session=session, progress=False,
                    backoff=Backoff(first=0.1, factor=2, cap=0.3, long_poll=5))
    done = client.wait("r1")
    assert done.status == "succeeded"
    assert clock.sleeps == [0.1, 0.2, 0.3]  # first read, then 0.1, 0.2, capped at 0.3
    assert all(p == {"wait": "5"} for _, _, p in session.calls[1:])  # every status read asks for the long-poll


def test_it_does_not_sleep_after_a_read_the_service_held(clock):
    session = StubSession(["queued", "running", "running", "succeeded"], clock, hold=5.0)
    client = Client("http://svc", token="t", session=session, progress=False,
                    backoff=Backoff(first=0.1, factor=2, cap=2, long_poll=5))
    assert client.wait("r1").status == "succeeded"
    assert clock.sleeps == []


def test_long_poll_off_and_timeout(clock):
    session = StubSession(["queued"] * 50, clock)
    client = Client("http://svc", token="t", session=session, progress=False,
                    backoff=Backoff(first=0.5, factor=1, cap=0.5, long_poll=0))
    with pytest.raises(WaitTimeout) as e:
        client.wait("r1", timeout=2.0)
    assert e.value.status == "queued" and sum(clock.sleeps) == pytest.approx(2.0)
    assert all(p is None for _, _, p in session.calls)


def test_a_failed_request_raises_with_its_code(clock):
    session = StubSession(["queued", "failed"], clock)
    client = Client("http://svc", token="t", session=session, progress=False)
    with pytest.raises(RequestFailed) as e:
        client.wait("r1")
    assert e.value.code == "request.failed_before_read" and e.value.request["status"] == "failed"


def test_the_progress_bar_shows_a_federated_runs_round_epsilon_and_dp_accuracy():
    from privacy_client.waiting import _Bar

    class FakeTqdm:
        def __init__(self, **kw):
            self.postfix, self.n = "", 0

        def set_postfix_str(self, text, refresh=True):
            self.postfix = text

        def update(self, n):
            self.n += n

        def refresh(self):
            pass

    bar = _Bar(FakeTqdm, "federated.train")
    bar.update({"status": "running", "progress": {
        "phase": "training", "fraction": 0.4, "round": 2, "rounds": 5, "epsilon_spent": 1.2345,
        "sites": {"sampled": ["a", "b", "c"], "accepted": ["a", "b"], "rejected": {}},
        "history": [{"round": 1, "epsilon_spent": 0.8},
                    {"round": 2, "epsilon_spent": 1.2345, "accuracy": 0.714, "accuracy_ci95": [0.66, 0.77]}]}})
    assert bar.bar.postfix == "training round 2/5 eps 1.23 sites 2 acc 0.71 [0.66, 0.77]"
    assert bar.bar.n == 40
