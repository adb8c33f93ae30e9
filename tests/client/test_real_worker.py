"""The whole path with nothing in-process: the client over HTTP to a live server, a real
Celery worker process on Redis running the requests, the client waiting with its progress
bar, then downloading a released synthetic table."""

from __future__ import annotations

import pytest

from tests.workers.conftest import real_worker, redis_server  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_client_waits_for_a_real_worker_and_downloads_its_table(server, real_worker, tmp_path,  # noqa: F811
                                                                   capsys, make_dataset, analyst, grant):
    from tests.client.conftest import SCHEMA
    from tests.conftest import small_frame

    grant(analyst, make_dataset("wide", epsilon=10.0, unit_column="patient_id", schema=SCHEMA,
                                frame=small_frame(6000, seed=4)))
    c = server.analyst
    seen, calls = [], []
    request = c.session.request

    def record(method, url, **kw):
        calls.append((method, url.removeprefix(server.url), kw.get("params")))
        return request(method, url, **kw)

    c.session.request = record
    result = c.mean("clinic", "income", by="site", epsilon=1.0, progress=seen.append, timeout=120)
    assert result.status == "succeeded" and result.df.index.name == "site" and seen[-1]["status"] == "succeeded"
    # the POST itself waited for the worker (?wait=, the long-poll's hold), then reads if it was not done
    hold = {"wait": f"{c.backoff.long_poll:g}"}
    assert calls[0] == ("POST", "/api/requests/", hold), calls
    assert all(m == "GET" and p == hold for m, _, p in calls[1:]), calls

    # a SQL query of several aggregates: one request, its plan through the database to the worker
    q = c.sql("SELECT site, COUNT(*) AS n, AVG(income) AS mean_income, MEDIAN(age) AS median_age FROM clinic "
              "WHERE age < 60 OR site = 'north' GROUP BY site ORDER BY n DESC", epsilon=0.6, timeout=120)
    assert list(q.df.columns[:4]) == ["site", "n", "mean_income", "median_age"] and len(q.df) == 4
    assert list(q.df["n"]) == sorted(q.df["n"], reverse=True) and q.epsilon == pytest.approx(0.6, rel=1e-6)

    synth = c.synthesize("wide", epsilon=2.0, rows=300, columns=["age", "site"], holdout_fraction=0.1, progress=True, timeout=240)
    table = synth.table(tmp_path)
    assert table.shape[0] == 300 and set(table.columns) == {"age", "site"}
    assert table["age"].dropna().between(18, 90).all() and set(table["site"].dropna()) <= {"north", "south", "east", "west"}
    assert synth.charge["rdp"]["epsilon"] <= 2.0 + 1e-9  # never above what was asked
    assert synth.charge["rdp"]["epsilon"] == pytest.approx(2.0, rel=1e-3)
    assert "synthesis.synthesize" in capsys.readouterr().err  # the progress bar was drawn
