"""A POST whose answer is lost on the way back (a dropped connection, a reverse proxy's 504,
an answer cut short) against the live service: the client retries it with its
Idempotency-Key, and when it gives up it says the request may have been admitted and
names the key that gets it back, never charged twice. A probe found the client raising
"nothing was kept" with no key after a 504, so running the query again charged twice."""

from __future__ import annotations

import io

import pytest
import requests
import urllib3

import privacy_client as pc
from governance.models import LedgerEntry, Request

from .conftest import make_client

pytestmark = pytest.mark.django_db(transaction=True)
SQL = "SELECT COUNT(*) AS n FROM clinic"


class Lossy(requests.Session):
    """Sends every request to the service for real; then loses the answers of the POSTs
    named in ``lose`` (0-based, in order): ``"drop"`` raises a dropped connection,
    ``"504"`` returns a gateway's page, ``"cut"`` a 200 whose JSON stops halfway."""

    def __init__(self, lose: dict[int, str]):
        super().__init__()
        self.lose, self.posts, self.keys = lose, 0, []

    def request(self, method, url, **kw):
        answer = super().request(method, url, **kw)
        if method != "POST" or "/api/requests/" not in url:
            return answer
        self.keys.append(kw["headers"]["Idempotency-Key"])
        fault, self.posts = self.lose.get(self.posts), self.posts + 1
        if fault == "drop":
            raise requests.ConnectionError(urllib3.exceptions.ProtocolError("Connection aborted.",
                                                                            ConnectionResetError(104, "reset")))
        if fault == "504":
            return _answer(504, b"<html>504 Gateway Time-out</html>")
        if fault == "cut":
            return _answer(200, answer.content[: len(answer.content) // 2])
        return answer


def _answer(status: int, content: bytes) -> requests.Response:
    r = requests.Response()
    r.status_code, r._content, r.encoding = status, content, "utf-8"
    return r


def _client(server, session) -> pc.Client:
    return make_client(server.url, server.tokens["ann"], session=session, retries=2)


@pytest.mark.parametrize("faults", [{0: "504"}, {0: "drop", 1: "504"}, {0: "cut"}, {0: "drop", 1: "drop"}])
def test_a_lost_answer_is_retried_with_its_key_and_charged_once(server, monkeypatch, faults):
    monkeypatch.setattr(pc.client.time, "sleep", lambda s: None)
    session = Lossy(faults)
    result = _client(server, session).sql(SQL, epsilon=0.1)
    assert result.status == "succeeded" and len(set(session.keys)) == 1 and session.posts == len(faults) + 1
    assert Request.objects.count() == 1 and LedgerEntry.objects.count() == 1


def test_when_every_retry_fails_the_error_names_the_key_that_gets_the_request_back(server, monkeypatch):
    monkeypatch.setattr(pc.client.time, "sleep", lambda s: None)
    session = Lossy({0: "drop", 1: "504", 2: "504"})
    with pytest.raises(pc.ServerError) as e:
        _client(server, session).sql(SQL, epsilon=0.1)
    err = e.value
    assert err.status == 504 and err.may_have_been_admitted and err.idempotency_key == session.keys[0]
    assert "may have been admitted" in str(err) and err.idempotency_key in str(err)
    assert Request.objects.count() == 1  # the first attempt was admitted
    again = server.analyst.sql(SQL, epsilon=0.1, idempotency_key=err.idempotency_key)
    assert str(again.id) == str(Request.objects.get().pk)
    assert Request.objects.count() == 1 and LedgerEntry.objects.count() == 1


def test_the_command_line_prints_the_key_and_takes_it_back(server, monkeypatch, capsys):
    from privacy_client import cli

    monkeypatch.setattr(pc.client.time, "sleep", lambda s: None)
    plain = requests.Session
    monkeypatch.setattr(requests, "Session", lambda: Lossy({0: "drop", 1: "504", 2: "504"}))
    argv = ["--url", server.url, "--token", server.tokens["ann"], "sql", SQL, "--epsilon", "0.1", "--format", "csv"]
    assert cli.main(argv) == 3
    err = capsys.readouterr().err
    key = err.split("--idempotency-key ")[1].split()[0]
    assert "may have been admitted" in err and Request.objects.count() == 1
    monkeypatch.setattr(requests, "Session", plain)
    assert cli.main([*argv, "--idempotency-key", key]) == 0
    assert Request.objects.count() == 1 and LedgerEntry.objects.count() == 1


class Refusing:
    headers: dict = {}

    def request(self, method, url, **kw):
        reason = urllib3.exceptions.NewConnectionError(None, "Failed to establish a new connection: refused")
        raise requests.ConnectionError(urllib3.exceptions.MaxRetryError(None, url, reason))


def test_a_service_never_reached_is_not_said_to_have_admitted_anything(monkeypatch):
    monkeypatch.setattr(pc.client.time, "sleep", lambda s: None)
    with pytest.raises(pc.ServerUnreachable) as e:
        pc.Client("http://x", session=Refusing(), progress=False).sql(SQL, epsilon=0.1)
    assert e.value.sent is False and e.value.may_have_been_admitted is False
    assert "nothing was admitted" in str(e.value) and "may have been" not in str(e.value)


class Answers:
    def __init__(self, *answers):
        self.answers, self.headers, self.calls = list(answers), {}, 0

    def request(self, method, url, **kw):
        self.calls += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def test_an_answer_that_is_not_a_request_is_an_error_not_a_wait_on_request_none():
    """A proxy answering ``200 {}``: the client polled /api/requests/None/ without end."""
    session = Answers(_answer(200, b"{}"))
    with pytest.raises(pc.ServerError) as e:
        pc.Client("http://x", session=session, progress=False, retries=0).sql(SQL, epsilon=0.1)
    assert e.value.code == "response.invalid" and session.calls == 1
    with pytest.raises(pc.ServerError, match="not a request"):
        pc.Client("http://x", session=session, progress=False).request("r1")


def test_a_download_cut_off_is_a_typed_error_and_leaves_no_part_file(tmp_path):
    class Cut(requests.Response):
        def iter_content(self, chunk_size=1, decode_unicode=False):
            yield b"0123456789"
            raise requests.exceptions.ChunkedEncodingError("Connection broken: IncompleteRead(10 bytes read)")

    cut = Cut()
    cut.status_code, cut.raw = 200, io.BytesIO()
    with pytest.raises(pc.ServerUnreachable) as e:
        pc.Client("http://x", session=Answers(cut), progress=False).download("r1", "model.pt", tmp_path / "out" / "model.pt")
    assert e.value.code == "connection.failed" and "IncompleteRead" in str(e.value.__cause__)
    assert list((tmp_path / "out").iterdir()) == []


def test_a_token_sent_in_clear_to_another_host_is_warned_about():
    with pytest.warns(pc.PlaintextWarning, match="unencrypted"):
        pc.Client("http://analytics.example.org", token="t")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for url in ("https://analytics.example.org", "http://localhost:8000", "http://127.0.0.1:8000"):
            pc.Client(url, token="t")
        pc.Client("http://analytics.example.org")  # no token: nothing to leak but public answers


def test_a_tls_failure_while_reading_the_answer_may_have_been_admitted(monkeypatch):
    """requests raises SSLError for a bad record in the answer too, after the POST went out
    (a TLS-terminating proxy dying mid-answer): it must not read "nothing was admitted"."""
    monkeypatch.setattr(pc.client.time, "sleep", lambda s: None)

    class BadRecord:
        headers: dict = {}

        def request(self, method, url, **kw):
            raise requests.exceptions.SSLError("[SSL: DECRYPTION_FAILED_OR_BAD_RECORD_MAC] bad record mac")

    with pytest.raises(pc.ServerUnreachable) as e:
        pc.Client("https://x", session=BadRecord(), progress=False).sql(SQL, epsilon=0.1)
    assert e.value.may_have_been_admitted is True and "may have been admitted" in str(e.value)


class Queued:
    """A service that admits the POST (202 queued) and then shows the request running."""

    def __init__(self):
        self.headers, self.keys = {}, []

    def request(self, method, url, **kw):
        if method == "POST":
            self.keys.append(kw["headers"]["Idempotency-Key"])
        body = {"id": "11111111-1111-1111-1111-111111111111", "status": "queued" if method == "POST" else "running",
                "engine": "aggregates", "kind": "count", "progress": {}}
        return _answer(202 if method == "POST" else 200, __import__("json").dumps(body).encode())


def test_a_wait_given_up_names_the_key_that_reads_the_request_again(monkeypatch, capsys):
    """The CLI gave up a wait (--wait) without the key: running the command again made a
    new request, charged again while the first still ran (a probe)."""
    from privacy_client import cli

    session = Queued()
    monkeypatch.setattr(requests, "Session", lambda: session)
    with pytest.raises(pc.WaitTimeout) as e:
        pc.Client("http://localhost:1", session=session, progress=False, backoff=pc.Backoff(long_poll=0)).sql(
            SQL, epsilon=0.1, timeout=0.2)
    assert e.value.idempotency_key == session.keys[-1]
    assert cli.main(["--url", "http://localhost:1", "sql", SQL, "--epsilon", "0.1", "--wait", "0.2"]) == 3
    err = capsys.readouterr().err
    assert "still running" in err and f"--idempotency-key {session.keys[-1]}" in err
