"""The client: one ``requests.Session`` to the service's REST API, with typed answers.

>>> from privacy_client import Client                                   # doctest: +SKIP
>>> client = Client("http://localhost:8000", token="...")               # doctest: +SKIP
>>> client.datasets_frame()                                             # doctest: +SKIP
>>> r = client.sql('SELECT gender, AVG(realrinc) FROM "gss-wages" GROUP BY gender', epsilon=0.2)  # doctest: +SKIP
>>> r.df                                                                # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import quote, urlsplit

import pandas as pd
import requests
import urllib3

from .errors import (ApiError, NotFound, RateLimited, RequestFailed, ServerError, ServerTimeout, SqlError,
                     ServerUnreachable, WaitTimeout, error_for)
from .results import Dataset, Estimate, Result, datasets_frame, plain_file_name
from .waiting import Backoff, progress_sink

Predicate = dict[str, Any] | tuple[str, str, Any]
# The query's pieces that may hold the word FROM without naming a table (string literals,
# quoted identifiers such as an alias "n from x", comments), parentheses (EXTRACT(YEAR FROM d)
# names no table), and FROM with the table after it
_SQL_PIECES = re.compile(r"""'(?:[^']|'')*'|--[^\n]*|/\*.*?\*/|(?P<paren>[()])"""
                         r"""|\bFROM\s+(?:"(?P<quoted>(?:[^"]|"")+)"|(?P<bare>[A-Za-z0-9_][A-Za-z0-9_-]*))"""
                         r'|"(?:[^"]|"")*"', re.IGNORECASE | re.DOTALL)


#: how long a wait without a timeout keeps reading a request's status through a service
#: that cannot be reached (a restart) before it gives up, naming the request
OUTAGE_SECONDS = 300.0


class Client:
    """An analyst's connection to the service.

    ``url`` and ``token`` default to the environment's ``PRIVACY_URL`` and
    ``PRIVACY_TOKEN``. ``progress`` is the default for waiting (``True``: a tqdm bar when
    tqdm is installed). Every error answer raises a subclass of ``ApiError`` carrying the
    service's code and numbers (``privacy_client.errors``)."""

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 60.0,
                 progress: Any = True, backoff: Backoff | None = None, retries: int = 2,
                 session: requests.Session | None = None):
        url = url or os.environ.get("PRIVACY_URL") or "http://localhost:8000"
        token = token if token is not None else os.environ.get("PRIVACY_TOKEN")
        if not (isinstance(timeout, (int, float)) and 0 < timeout < float("inf")):
            raise ValueError(f"timeout must be a number of seconds above 0, got {timeout!r}")
        self.url = url.rstrip("/")
        if token and _in_clear(self.url):
            warnings.warn(f"{self.url} is plain http to another host: your token and results cross the network "
                          "unencrypted; use https", PlaintextWarning, stacklevel=2)
        self.timeout = timeout
        self.progress = progress
        self.backoff = backoff or Backoff()
        self.retries = retries
        self.session = session or requests.Session()
        self.session.headers["Accept"] = "application/json"
        if token:
            self.session.headers["Authorization"] = f"Token {token}"

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # ------------------------------------------------------------------ HTTP

    def _send(self, method: str, path: str, **kw: Any) -> requests.Response:
        """One HTTP exchange; a failure to reach the service or a timeout is a typed error
        (``ServerUnreachable``, ``ServerTimeout``), never a raw ``requests`` exception."""
        timeout = kw.pop("timeout", None) or self.timeout
        url = self.url + path
        try:
            return self.session.request(method, url, timeout=timeout, **kw)
        except (requests.exceptions.InvalidJSONError, requests.exceptions.InvalidHeader) as e:
            # nothing was sent: the client's own input (a NaN in the body, a token with a
            # newline), not the service or the network
            raise ValueError(f"{method} {url}: the request could not be sent ({_reason(e)}); nothing reached the "
                             "service") from e
        except requests.RequestException as e:
            raise _network_error(method, url, timeout, e) from e

    def _call(self, method: str, path: str, *, json: Any = None, params: dict | None = None,
              headers: dict | None = None, timeout: float | None = None) -> Any:
        r = self._send(method, path, json=json, params=params, headers=headers, timeout=timeout)
        if r.status_code >= 400:
            raise _error(r)
        return _json(r)

    def call(self, method: str, path: str, *, json: Any = None, data: bytes | str | None = None,
             params: dict | None = None, headers: dict | None = None) -> Any:
        """Any endpoint of the API (``path`` from ``/api/...``), for what has no method here
        (e.g. an officer's); the answer as parsed JSON, errors typed like every other call."""
        r = self._send(method, path, json=json, data=data, params=params, headers=headers)
        if r.status_code >= 400:
            raise _error(r)
        if r.status_code == 204 or not r.content:
            return None
        return _json(r)

    def _pages(self, path: str, params: dict | None = None) -> Iterable[dict]:
        """Every item of a paged list, once: a list is newest first, so an item created while
        it is paged moves the older ones a place on (a probe listed 169 requests, 144 of
        them distinct)."""
        params = {"page_size": 1000, **(params or {})}
        page, seen = 1, set()
        while True:
            body = self._call("GET", path, params={**params, "page": page})
            if not isinstance(body, dict) or "results" not in body:
                yield from body
                return
            for item in body["results"]:
                key = item.get("id", item.get("name")) if isinstance(item, dict) else None
                if key is None or key not in seen:
                    if key is not None:
                        seen.add(key)
                    yield item
            if not body.get("next"):
                return
            page += 1

    # ------------------------------------------------------------------ who and what

    def me(self) -> dict[str, Any]:
        """Who you are, your grants and what you have spent."""
        return self._call("GET", "/api/me/")

    def datasets(self) -> list[Dataset]:
        """The datasets you may use, with their public schemas and budgets."""
        return [Dataset.from_json(d) for d in self._pages("/api/datasets/")]

    def datasets_frame(self) -> pd.DataFrame:
        """The datasets as a table: name, units, policy, budget and epsilon remaining."""
        return datasets_frame(self.datasets())

    def dataset(self, name: str) -> Dataset:
        with _naming_dataset(name):
            return Dataset.from_json(self._call("GET", f"/api/datasets/{_seg(name)}/"))

    def engines(self) -> list[dict[str, Any]]:
        """The engines, their kinds and each kind's parameter schema."""
        return self._call("GET", "/api/engines/")["results"]

    def preview(self, dataset: str, rows: int = 100, seed: int = 0) -> pd.DataFrame:
        """Dummy rows generated from the dataset's public schema alone (free; no stored row
        is read): for trying code and queries before spending budget."""
        with _naming_dataset(dataset):
            body = self._call("GET", f"/api/datasets/{_seg(dataset)}/preview/", params={"rows": rows, "seed": seed})
        return pd.DataFrame(body["data"], columns=body["columns"])

    # ------------------------------------------------------------------ cost first

    def estimate(self, dataset: str, kind: str, *, engine: str = "aggregates", params: dict | None = None,
                 **kw: Any) -> Estimate:
        """What the request would cost (its event, the charge under every accountant),
        whether the gate would admit it now and how many such requests fit. Free."""
        body = {"engine": engine, "kind": kind, "params": _params(params, kw)}
        return Estimate.from_json(self._call("POST", f"/api/datasets/{_seg(dataset)}/estimate/", json=body))

    def estimate_sql(self, sql: str, *, dataset: str | None = None, **options: Any) -> Estimate:
        """What a SQL query would cost (``options``: epsilon, rho, accuracy, mechanism,
        max_rows_per_unit, candidates). Free."""
        dataset = dataset or _dataset_of(sql)  # (the service reads the SQL's own errors first)
        body = {"sql": sql, "params": options}
        return Estimate.from_json(self._call("POST", f"/api/datasets/{_seg(dataset)}/estimate/", json=body))

    def estimate_events(self, dataset: str, events: list[dict] | dict) -> Estimate:
        """The cost of mechanism events (e.g. a release made elsewhere)."""
        body = {"events": events} if isinstance(events, list) else {"event": events}
        return Estimate.from_json(self._call("POST", f"/api/datasets/{_seg(dataset)}/estimate/", json=body))

    # ------------------------------------------------------------------ requests

    def submit(self, dataset: str, kind: str, *, engine: str = "aggregates", params: dict | None = None,
               idempotency_key: str | None = None, **kw: Any) -> Result:
        """Plan, gate and queue a request; returns at once (queued, or replayed)."""
        return self._post_request({"dataset": dataset, "engine": engine, "kind": kind,
                                   "params": _params(params, kw)}, idempotency_key)

    def submit_sql(self, sql: str, *, idempotency_key: str | None = None, **options: Any) -> Result:
        """Send a SQL query (planned by the service into an aggregates request); returns at once."""
        return self._post_request({"sql": sql, "params": options}, idempotency_key)

    def _post_request(self, body: dict, key: str | None, hold: float = 0.0) -> Result:
        # An Idempotency-Key makes a retry after a lost answer safe: the service returns
        # the first request and charges nothing twice. ``hold`` > 0: the answer waits up to
        # that long for the result (``?wait=``), so a quick request is done in one call.
        # Retried: a connection lost, a timeout, a 5xx (a gateway's 502/504 too) and an
        # answer cut short. Given up, the error says whether an attempt may have been
        # admitted and carries the key that gets it back.
        key = key or str(uuid.uuid4())
        headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
        params = {"wait": f"{hold:g}"} if hold > 0 else None
        landed = False  # whether an attempt may have reached the service and been admitted
        for attempt in range(self.retries + 1):
            try:
                answer = self._call("POST", "/api/requests/", json=body, headers=headers, params=params,
                                    timeout=self.timeout + hold)
                return Result(_request_json(answer), self)
            except (ServerUnreachable, ServerError) as e:  # ServerTimeout too
                landed = landed or _may_have_landed(e)
                if attempt == self.retries or e.code in ("storage.full", "storage.unwritable"):
                    raise _with_key(e, key, landed) from e
                time.sleep(_pause(e, attempt))
            except ApiError as e:  # a refusal or a 429 of a retry: an earlier attempt may still have landed
                if landed:
                    raise _with_key(e, key, landed) from e
                raise
        raise AssertionError("unreachable")

    def run(self, dataset: str, kind: str, *, engine: str = "aggregates", params: dict | None = None,
            timeout: float | None = None, progress: Any = None, dummy: bool = False, dummy_rows: int = 1000,
            seed: int = 0, idempotency_key: str | None = None, **kw: Any) -> Result:
        """Submit and wait for the result (a progress bar while it runs). Raises
        ``RequestFailed`` if the request ends without a result. ``dummy=True`` (an aggregate
        but a histogram; so ``count(..., dummy=True)`` and the like too): the request as SQL,
        run locally on dummy rows like ``sql(..., dummy=True)``, nothing charged."""
        if dummy:
            from . import dummy as dummy_run

            dummy_run.check_runs_on_dummy_rows(engine, kind)
            asked = _params(params, kw)
            # priced and checked as the request it is (its errors and its result's shape are
            # the real call's); only run as SQL on the dummy rows
            estimate = self.estimate(dataset, kind, engine=engine, params=dummy_run.priced(asked))
            sql, _ = dummy_run.sql_of(dataset, engine, kind, asked)
            return dummy_run.run(self, sql, dataset, rows=dummy_rows, seed=seed, estimate=estimate)
        return self._run({"dataset": dataset, "engine": engine, "kind": kind, "params": _params(params, kw)},
                         timeout, progress, idempotency_key)

    def sql(self, sql: str, *, timeout: float | None = None, progress: Any = None, dummy: bool = False,
            dummy_rows: int = 1000, seed: int = 0, idempotency_key: str | None = None, **options: Any) -> Result:
        """Run a SQL query and wait for its result (``.df``: values with 95% intervals).
        ``idempotency_key``: the key an earlier error named (its POST may have been
        admitted): that request comes back, never charged twice (default: a new key).

        ``dummy=True``: run it locally with DuckDB on ``dummy_rows`` dummy rows (``preview``,
        generated from the public schema) instead: the same checks and the same DataFrame
        columns as the real answer, no noise, nothing charged (``privacy_client.dummy``)."""
        if dummy:
            from . import dummy as dummy_run

            return dummy_run.run(self, sql, _dataset_of(sql), rows=dummy_rows, seed=seed, **options)
        return self._run({"sql": sql, "params": options}, timeout, progress, idempotency_key)

    def _run(self, body: dict, timeout: float | None, progress: Any, key: str | None = None) -> Result:
        """POST that waits for the result as a status read would (``Backoff.long_poll``), then
        ``wait`` for the rest: a quick request is answered in one call (a service without
        ``?wait=`` answers at once, and ``wait`` polls)."""
        start = time.monotonic()
        hold = self.backoff.long_poll if timeout is None else max(0.0, min(self.backoff.long_poll, timeout))
        key = key or str(uuid.uuid4())
        submitted = self._post_request(body, key, hold)
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
        try:
            return self.wait(submitted, timeout=left, progress=progress)
        except WaitTimeout as e:  # the whole call's seconds, not the wait's share of them
            raise WaitTimeout(e.request_id, e.status, timeout, idempotency_key=key) from None
        except (ServerUnreachable, ServerError, RateLimited) as e:  # a wait given up: the request goes on
            raise type(e)(e.code, e.status, f"{e.detail}, or the same call with idempotency_key={key!r}",
                          {**e.body, "idempotency_key": key, "may_have_been_admitted": True}) from e

    def request(self, request_id: str) -> Result:
        return Result(_request_json(self._call("GET", f"/api/requests/{_seg(request_id)}/")), self)

    def requests(self, **filters: Any) -> list[Result]:
        """Your requests (filters: status, dataset__name, engine, kind)."""
        return [Result(r, self) for r in self._pages("/api/requests/", filters)]

    def cancel(self, request_id: str | Result) -> Result:
        rid = request_id.id if isinstance(request_id, Result) else request_id
        return Result(self._call("POST", f"/api/requests/{_seg(rid)}/cancel/"), self)

    def wait(self, request: str | Result, *, timeout: float | None = None, progress: Any = None) -> Result:
        """Wait until the request is done; returns it, or raises ``RequestFailed`` (failed or
        cancelled) or ``WaitTimeout`` (``timeout`` seconds passed; the request goes on)."""
        current = request if isinstance(request, Result) else self.request(request)
        rid = current.id
        sink = progress_sink(self.progress if progress is None else progress, f"{current.engine}.{current.kind}")
        start = time.monotonic()
        try:
            sink.update(current.raw)
            delays = self.backoff.delays()
            while not current.done:
                left = None if timeout is None else timeout - (time.monotonic() - start)
                if left is not None and left <= 0:
                    raise WaitTimeout(rid, current.status, timeout)
                delay = next(delays)
                hold = self.backoff.long_poll if left is None else max(0.0, min(self.backoff.long_poll, left))
                t0 = time.monotonic()
                params = {"wait": f"{hold:g}"} if hold > 0 else None
                body = self._poll(rid, params, self.timeout + hold, None if timeout is None else start + timeout)
                current = Result(body, self)
                sink.update(body)
                if not current.done:
                    rest = delay - (time.monotonic() - t0)
                    if left is not None:
                        rest = min(rest, left - (time.monotonic() - t0))
                    if rest > 0:
                        time.sleep(rest)
        finally:
            sink.close()
        if current.status != "succeeded":
            err = current.error or {}
            code = err.get("code") or f"request.{current.status}"
            raise RequestFailed(code, 200, err.get("detail") or f"request {rid} {current.status}",
                                {**err, "code": code, "request": current.raw})
        return current

    def _poll(self, rid: str, params: dict | None, timeout: float, deadline: float | None) -> Any:
        """One status read while waiting, read again after a transient answer (503 with its
        Retry-After, a 429, a connection lost) until the wait's ``deadline`` (monotonic), or
        for ``OUTAGE_SECONDS`` without one: the request was admitted and charged, and a
        restart of the service must not end the analyst's wait. Given up, the error names
        the request (``request_id``), which goes on."""
        give_up = deadline if deadline is not None else time.monotonic() + OUTAGE_SECONDS
        attempt = 0
        while True:
            try:
                return _request_json(self._call("GET", f"/api/requests/{_seg(rid)}/", params=params, timeout=timeout))
            except (RateLimited, ServerError, ServerUnreachable) as e:
                transient = not isinstance(e, ServerError) or e.status in (502, 503, 504)
                after = getattr(e, "retry_after", None)
                pause = min(after if after is not None else 0.5 * 2 ** attempt, 5.0 if after is None else 30.0)
                if not transient or time.monotonic() + pause > give_up:
                    raise type(e)(e.code, e.status, f"{e.detail}; request {rid} was admitted and goes on: "
                                  f"client.wait({rid!r}) reads it later", {**e.body, "request_id": rid}) from e
                time.sleep(pause)
                attempt += 1

    # ------------------------------------------------------------------ files

    def download(self, request_id: str, name: str, path: str | Path | None = None, *,
                 sha256: str | None = None) -> Path:
        """Save a released file to ``path`` (default: ``name`` in the current directory);
        checks its SHA-256 when given."""
        target = Path(path) if path is not None else Path(plain_file_name(name))
        path_ = f"/api/requests/{_seg(request_id)}/files/{_seg(name)}/"
        r = self._send("GET", path_, stream=True)
        if r.status_code >= 400:
            raise _error(r)
        digest = hashlib.sha256()
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        try:
            with r, open(partial, "wb") as out:
                for chunk in r.iter_content(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
        except requests.RequestException as e:  # the connection dropped or stalled mid-file
            partial.unlink(missing_ok=True)
            raise _network_error("GET", self.url + path_, self.timeout, e) from e
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        if sha256 and digest.hexdigest() != sha256:
            partial.unlink()
            raise ApiError("download.corrupt", 200, f"{name}: SHA-256 {digest.hexdigest()} is not the listed "
                                                    f"{sha256}", {})
        partial.replace(target)
        return target

    # ------------------------------------------------------------------ a pandas-like layer

    def count(self, dataset: str, column: str | None = None, *, by: str | None = None,
              where: Iterable[Predicate] | None = None, **kw: Any) -> Result:
        """``COUNT(*)``, or ``COUNT(column)`` (the rows where it is not null), [``WHERE``]
        [``GROUP BY by``]; waits and returns the result."""
        return self.run(dataset, "count", params=_shape(column, by, where), **kw)

    def sum(self, dataset: str, column: str, *, by: str | None = None,
            where: Iterable[Predicate] | None = None, **kw: Any) -> Result:
        return self.run(dataset, "sum", params=_shape(column, by, where), **kw)

    def mean(self, dataset: str, column: str, *, by: str | None = None,
             where: Iterable[Predicate] | None = None, **kw: Any) -> Result:
        return self.run(dataset, "mean", params=_shape(column, by, where), **kw)

    def variance(self, dataset: str, column: str, *, by: str | None = None,
                 where: Iterable[Predicate] | None = None, **kw: Any) -> Result:
        return self.run(dataset, "variance", params=_shape(column, by, where), **kw)

    def quantile(self, dataset: str, column: str, q: float = 0.5, *, by: str | None = None,
                 where: Iterable[Predicate] | None = None, **kw: Any) -> Result:
        return self.run(dataset, "quantile", params={**_shape(column, by, where), "q": q}, **kw)

    def histogram(self, dataset: str, column: str, *, bins: list[float] | None = None,
                  where: Iterable[Predicate] | None = None, **kw: Any) -> Result:
        params = _shape(column, None, where)
        if bins is not None:
            params["bins"] = list(bins)
        return self.run(dataset, "histogram", params=params, **kw)

    def train(self, dataset: str, target: str, *, params: dict | None = None, **kw: Any) -> Result:
        """A DP-SGD model (``target_epsilon``, ``epochs``, ... as keywords or in ``params``);
        ``download_all()`` saves it."""
        return self.run(dataset, "train", engine="dpsgd", params={**(params or {}), "target": target}, **kw)

    def synthesize(self, dataset: str, **kw: Any) -> Result:
        """A DP synthetic table (``epsilon``, ``method``, ``rows``); ``table()`` reads it."""
        return self.run(dataset, "synthesize", engine="synthesis", **kw)




def _params(params: dict | None, kw: dict) -> dict:
    out = dict(params or {})
    out.update(kw)
    return out


def _shape(column: str | None, by: str | None, where: Iterable[Predicate] | None) -> dict:
    params: dict[str, Any] = {}
    if column is not None:
        params["column"] = column
    if where:
        params["where"] = [_predicate(p) for p in where]
    if by is not None:
        params["group_by"] = by
    return params


def _predicate(p: Predicate) -> dict:
    """A predicate as the service reads it: ``(column, op, value)`` or its dict, and inside
    ``{"or": [[...], ...]}`` and ``{"not": [...]}`` alike."""
    if isinstance(p, dict):
        if isinstance(p.get("or"), (list, tuple)):
            return {**p, "or": [[_predicate(q) for q in branch] if isinstance(branch, (list, tuple)) else branch
                                for branch in p["or"]]}
        if isinstance(p.get("not"), (list, tuple)):
            return {**p, "not": [_predicate(q) for q in p["not"]]}
        return dict(p)
    column, op, value = p
    return {"column": column, "op": op, "value": list(value) if isinstance(value, (tuple, set)) else value}


def _dataset_of(sql: str) -> str:
    """``_table_of``, or a ``SqlError`` naming FROM where the query has none."""
    try:
        return _table_of(sql)
    except ValueError:  # (the service names what it cannot read; here no dataset is known to ask it)
        raise SqlError("sql.invalid", 400, "no FROM dataset found in the query: a query is one SELECT "
                       "... FROM dataset (quoted with \"...\" if need be)", {"part": "FROM"}) from None


def _table_of(sql: str) -> str:
    """The dataset a query reads: the table after its first FROM outside parentheses (else
    the first inside them: a subquery's), never a FROM inside a literal, a quoted name or a
    comment."""
    depth, nested = 0, None
    for m in _SQL_PIECES.finditer(sql):
        if m["paren"]:
            depth = max(0, depth + (1 if m["paren"] == "(" else -1))
        elif m["quoted"] is not None or m["bare"] is not None:
            name = m["quoted"].replace('""', '"') if m["quoted"] is not None else m["bare"]
            if depth == 0:
                return name
            nested = nested or name
    if nested is None:
        raise ValueError("no FROM dataset in the query; pass dataset=")
    return nested


def _json(r: requests.Response) -> Any:
    """The answer's JSON; an answer that is not JSON (a proxy's or a captive portal's page
    with status 200) is a ``ServerError`` ``response.invalid``."""
    try:
        return r.json()
    except ValueError:
        raise ServerError("response.invalid", r.status_code, f"the answer is not the service's JSON: "
                                                            f"{r.text[:200]!r}", {}) from None


class PlaintextWarning(UserWarning):
    """The client sends its token over plain http to a host other than this machine."""


def _in_clear(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme.lower() == "http" and (parts.hostname or "") not in ("localhost", "127.0.0.1", "::1")


def _request_json(body: Any) -> dict:
    """A request as the service shows it; an answer without its ``id`` and ``status`` (a
    proxy's ``{}``) is a ``ServerError`` ``response.invalid``, not a request ``None`` to
    wait on."""
    if not (isinstance(body, dict) and isinstance(body.get("id"), str) and isinstance(body.get("status"), str)):
        raise ServerError("response.invalid", 200, f"the answer is not a request of the service: {str(body)[:200]!r}",
                          {})
    return body


def _network_error(method: str, url: str, timeout: float, e: requests.RequestException) -> ServerUnreachable:
    """A failure to reach the service, typed; ``sent`` is False when it came before any of
    the request left (refused, a name not found, a connect timeout, a bad URL)."""
    sent = not _before_sending(e)
    if isinstance(e, requests.Timeout):
        return ServerTimeout("connection.timeout", 0, f"{method} {url}: no answer within {timeout:g} s "
                                                      f"({type(e).__name__})",
                             {"url": url, "timeout": timeout, "sent": sent})
    # refused, reset, dropped mid-answer, an invalid URL or scheme
    return ServerUnreachable("connection.failed", 0, f"{method} {url}: cannot reach the service "
                                                     f"({_reason(e)}); is it running, and is the URL right?",
                             {"url": url, "sent": sent})


def _before_sending(e: requests.RequestException) -> bool:
    # (not every SSLError: one raised reading the answer comes after the request went out)
    if isinstance(e, (requests.exceptions.ConnectTimeout, requests.exceptions.InvalidURL,
                      requests.exceptions.MissingSchema, requests.exceptions.InvalidSchema)):
        return True
    reason = getattr(e.args[0], "reason", None) if e.args else None
    return isinstance(reason, urllib3.exceptions.NewConnectionError)


#: the service's own 5xx codes for an answer that kept nothing
_NOTHING_KEPT = ("storage.full", "storage.unwritable", "database.unavailable", "cluster.unavailable")


def _may_have_landed(e: ApiError) -> bool:
    """Whether the attempt that failed with ``e`` may have been admitted: a connection lost
    after the request went out, a timeout, a gateway's 5xx or an answer cut short; not a
    connection never made, nor the service's own "nothing was kept"."""
    if isinstance(e, ServerUnreachable):
        return bool(e.body.get("sent", True))
    return e.code not in _NOTHING_KEPT


def _pause(e: ApiError, attempt: int) -> float:
    after = getattr(e, "retry_after", None) if isinstance(e, ServerError) else None
    return min(after, 10.0) if after is not None else 0.2 * 2 ** attempt


def _with_key(e: ApiError, key: str, landed: bool) -> ApiError:
    """``e`` again, with the POST's key and what the analyst can do."""
    if landed:
        note = (f"an attempt may have been admitted: submit it again with idempotency_key={key!r} to get that "
                "request, never charged twice")
    else:
        note = f"nothing was admitted (idempotency_key={key!r})"
    return type(e)(e.code, e.status, f"{e.detail}; {note}", {**e.body, "idempotency_key": key,
                                                             "may_have_been_admitted": landed})


def _seg(value: Any) -> str:
    return quote(str(value), safe="")


@contextlib.contextmanager
def _naming_dataset(name: str):
    """A 404 on a dataset's URL says which dataset, and where the names are."""
    try:
        yield
    except NotFound as e:
        detail = (f"No dataset {name!r} that you may use (the service says: {e.detail or 'not found'}); "
                  "datasets() lists yours")
        raise NotFound(e.code, e.status, detail, {**e.body, "dataset": name}) from None


def _reason(e: Exception) -> str:
    """The innermost reason of a connection failure ("Connection refused", "Name or service not known")."""
    text = str(e)
    m = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    if m:
        return m.group(1).strip()
    return type(e).__name__


def _error(r: requests.Response) -> ApiError:
    try:
        body: Any = r.json()
    except ValueError:
        body = r.text
    return error_for(r.status_code, body, r.headers.get("Retry-After"))
