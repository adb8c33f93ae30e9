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


class Raw:
    """An answer as a proxy or a busy service gives it: a status, text, headers."""

    def __init__(self, status, text, headers=None, body=None):
        self.status_code, self.text, self.headers, self._body = status, text, headers or {}, body
        self.content = text.encode()

    def json(self):
        if self._body is None:
            import json

            return json.loads(self.text)  # raises ValueError on a page
        return self._body


class Scripted:
    def __init__(self, answers):
        self.answers, self.headers, self.calls = list(answers), {}, 0

    def request(self, method, url, params=None, **kw):
        self.calls += 1
        return self.answers.pop(0)


def test_one_busy_answer_while_waiting_does_not_end_the_wait_of_a_charged_request(clock):
    """A 503 database.unavailable (Retry-After 1) on the first status read made run() raise
    after the request was admitted and charged (probe AK): read again after Retry-After."""
    running = {"id": "r1", "engine": "aggregates", "kind": "count", "status": "running", "progress": {}}
    done = {**running, "status": "succeeded", "result": {"value": 3}}
    busy = Raw(503, '{"code": "database.unavailable", "detail": "busy", "retry_after": 1}', {"Retry-After": "1"})
    proxy_429 = Raw(429, "Too Many Requests", {"Retry-After": "2"})
    session = Scripted([busy, proxy_429, Raw(200, "", body=done)])
    got = Client("http://x", session=session, progress=False, backoff=Backoff(long_poll=0)).wait(
        __import__("privacy_client").Result(running))
    assert got.status == "succeeded" and session.calls == 3 and clock.sleeps[:2] == [1.0, 2.0]


def test_answers_that_are_not_the_service_s_json_are_typed_errors():
    import privacy_client as pc

    page = Raw(200, "<html>captive portal</html>")
    with pytest.raises(pc.ServerError) as e:
        Client("http://x", session=Scripted([page])).datasets()
    assert e.value.code == "response.invalid"
    with pytest.raises(pc.RateLimited) as e:
        Client("http://x", session=Scripted([Raw(429, "slow down", {"Retry-After": "7"})])).datasets()
    assert e.value.retry_after == 7.0
    odd = Raw(429, '{"code": "rate.limited", "detail": "x", "retry_after": "soon"}')
    with pytest.raises(pc.RateLimited) as e:
        Client("http://x", session=Scripted([odd])).datasets()
    assert e.value.retry_after is None
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="timeout"):
            Client("http://x", timeout=bad)


def test_the_command_line_says_what_is_wrong_without_a_traceback(capsys):
    from privacy_client.cli import main

    assert main(["--url", "http://127.0.0.1:9", "sql", "SELECT 1", "--estimate"]) == 2
    assert "no FROM dataset" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--timeout", "0", "datasets"])
    assert e.value.code == 2 and "above 0" in capsys.readouterr().err
    assert main(["--url", "not a url", "datasets"]) == 3
    assert "cannot reach the service" in capsys.readouterr().err


def test_a_wait_reads_through_a_restart_and_gives_up_naming_the_request(clock):
    """A probe stopped the service 4 s into a wait: the client gave up after two reads
    (1.5 s), hiding that the request had been admitted; asked again, it was charged twice.
    The wait now keeps reading until its timeout, and the error names the request."""
    import requests

    running = {"id": "r1", "engine": "aggregates", "kind": "count", "status": "running", "progress": {}}
    done = {**running, "status": "succeeded", "result": {"value": 3}}

    class Down:
        def __init__(self, down_reads, then):
            self.down, self.then, self.calls, self.headers = down_reads, then, 0, {}

        def request(self, method, url, params=None, **kw):
            self.calls += 1
            if self.calls <= self.down:
                raise requests.ConnectionError("Connection refused")
            return Answer(self.then)

    session = Down(8, done)
    got = Client("http://x", session=session, progress=False, backoff=Backoff(long_poll=0)).wait(
        __import__("privacy_client").Result(running), timeout=60)
    assert got.status == "succeeded" and session.calls == 9
    session, start = Down(10**6, done), clock.now
    with pytest.raises(__import__("privacy_client").ServerUnreachable) as e:
        Client("http://x", session=session, progress=False, backoff=Backoff(long_poll=0)).wait(
            __import__("privacy_client").Result(running), timeout=30)
    assert e.value.request_id == "r1" and "client.wait('r1')" in str(e.value) and 25 <= clock.now - start <= 31


def test_a_post_whose_answers_never_came_names_its_idempotency_key(clock):
    import requests

    import privacy_client as pc

    class Refused:
        headers: dict = {}

        def request(self, method, url, **kw):
            self.key = kw["headers"]["Idempotency-Key"]
            raise requests.ConnectionError("Connection refused")

    session = Refused()
    with pytest.raises(pc.ServerUnreachable) as e:
        Client("http://x", session=session, progress=False).sql("SELECT COUNT(*) FROM t")
    assert e.value.idempotency_key == session.key and session.key in str(e.value)


@pytest.mark.parametrize("call", [lambda c: c.run("t", "count", epsilon=float("nan")),
                                  lambda c: c.request("r1")])
def test_input_the_client_cannot_send_is_a_value_error_not_an_unreachable_service(call):
    """epsilon=nan (not JSON) and a token ending in a newline (not a header) were reported
    as "cannot reach the service" and retried with sleeps."""
    import privacy_client as pc

    client = pc.Client("http://127.0.0.1:9", token="abc\n", progress=False)
    with pytest.raises(ValueError, match="could not be sent"):
        call(client)
