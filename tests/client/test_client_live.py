"""The client end to end against a live HTTP server: datasets, preview, estimate, run,
SQL, DataFrames with intervals, progress, downloads."""

from __future__ import annotations

import hashlib

import pandas as pd
import pytest

from governance.models import LedgerEntry, Request
from tests.access.conftest import filedrop_engine  # noqa: F401 - a fixture: an engine that releases files

pytestmark = pytest.mark.django_db(transaction=True)


def test_five_lines_from_token_to_dataframe(server):
    from privacy_client import Client

    client = Client(server.url, token=server.tokens["ann"], progress=False)
    datasets = client.datasets_frame()
    result = client.sql("SELECT site, AVG(income) FROM clinic GROUP BY site", epsilon=0.5)
    df = result.df
    assert list(datasets["name"]) == ["clinic"] and datasets["remaining_epsilon"][0] == pytest.approx(20.0)
    assert list(df.index) == ["north", "south", "east", "west"] and df.index.name == "site"
    assert list(df.columns) == ["value", "ci_low", "ci_high"]
    assert (df["ci_low"] <= df["value"]).all() and (df["value"] <= df["ci_high"]).all()
    assert result.epsilon == pytest.approx(0.5, rel=1e-6)


def test_datasets_show_schema_and_the_budget_left(server):
    (ds,) = server.analyst.datasets()
    assert ds.name == "clinic" and ds.unit_column == "patient_id" and ds.policy == "rdp"
    assert ds.remaining_epsilon == pytest.approx(20.0)
    schema = ds.schema.set_index("name")
    assert schema.loc["age", "lower"] == 18 and schema.loc["site", "domain"] == ["north", "south", "east", "west"]
    server.analyst.run("clinic", "count", epsilon=2.0)
    assert server.analyst.dataset("clinic").remaining_epsilon == pytest.approx(18.0, abs=1e-3)  # under RDP
    assert server.outsider.datasets() == []


def test_preview_is_a_dataframe_of_the_schema_and_free(server):
    df = server.analyst.preview("clinic", rows=40, seed=3)
    assert isinstance(df, pd.DataFrame) and df.shape == (40, 4)
    assert list(df.columns) == ["patient_id", "age", "income", "site"]
    assert df["age"].between(18, 90).all() and set(df["site"]) <= {"north", "south", "east", "west"}
    assert df.equals(server.analyst.preview("clinic", rows=40, seed=3))
    assert not LedgerEntry.objects.exists()


def test_estimate_then_run_charges_what_the_estimate_said(server):
    est = server.analyst.estimate("clinic", "mean", column="income", group_by="site", epsilon=0.8)
    assert est.would_admit and est.epsilon == pytest.approx(0.8, rel=1e-6) and est.fits >= 20
    assert est.request == {"engine": "aggregates", "kind": "mean",
                           "params": {"column": "income", "group_by": "site", "epsilon": 0.8}}
    assert not LedgerEntry.objects.exists()
    result = server.analyst.mean("clinic", "income", by="site", epsilon=0.8)
    assert result.status == "succeeded" and est.event.items() >= result.event.items()
    assert result.charge["basic"] == est.charge["basic"]


def test_sql_and_the_client_api_give_the_same_event_and_cost(server):
    c = server.analyst
    where = [("age", ">=", 30), ("site", "in", ["north", "east"])]
    sql = "SELECT SUM(income) FROM clinic WHERE age >= 30 AND site IN ('north', 'east')"
    est_api = c.estimate("clinic", "sum", column="income", where=[{"column": "age", "op": ">=", "value": 30},
                                                                  {"column": "site", "op": "in",
                                                                   "value": ["north", "east"]}], epsilon=0.3)
    est_sql = c.estimate_sql(sql, epsilon=0.3)
    assert est_sql.event == est_api.event and est_sql.charge == est_api.charge
    first = c.sum("clinic", "income", where=where, epsilon=0.3)
    second = c.sql(sql, epsilon=0.3)
    # the same request: the SQL one is the client's, replayed from its release at no cost
    assert second.replayed and second.raw["replay_of"] == first.id
    assert (second.kind, second.params, second.event) == (first.kind, first.params, first.event)
    assert second.df.equals(first.df)
    assert LedgerEntry.objects.count() == 1


@pytest.mark.parametrize("call,index", [
    (lambda c: c.count("clinic", epsilon=1.0), "count"),
    (lambda c: c.count("clinic", by="site", where=[("age", "<", 60)], epsilon=1.0, max_rows_per_unit=2), "site"),
    (lambda c: c.variance("clinic", "age", epsilon=1.0), "variance"),
    (lambda c: c.quantile("clinic", "age", 0.5, epsilon=1.0), "quantile"),
    (lambda c: c.histogram("clinic", "age", bins=[18, 40, 60, 90], epsilon=1.0), "bin"),
    (lambda c: c.sql("SELECT site, MEDIAN(income) FROM clinic GROUP BY site", epsilon=1.0), "site"),
])
def test_every_aggregate_comes_back_as_a_dataframe(server, call, index):
    df = call(server.analyst).df
    assert list(df.columns) == ["value", "ci_low", "ci_high"] and df.index.name in (index, "kind")
    assert df["value"].notna().all()
    bounded = df.dropna()
    assert ((bounded["ci_low"] <= bounded["value"]) & (bounded["value"] <= bounded["ci_high"])).all()


def test_progress_goes_to_a_callback_and_a_bar(server, capsys):
    seen = []
    server.analyst.run("clinic", "count", epsilon=0.1, progress=seen.append)
    assert seen and seen[-1]["status"] == "succeeded"
    server.analyst.run("clinic", "count", group_by="site", epsilon=0.1, progress=True)
    err = capsys.readouterr().err
    assert "aggregates.count" in err and "100%" in err  # tqdm's bar, on stderr in a terminal


def test_wait_polls_a_queued_request_until_it_is_done(server, monkeypatch):
    """The task is sent only after the client has its 202: the client waits (``?wait=`` or backoff)."""
    import threading

    from governance.requests import submission

    sent = []
    monkeypatch.setattr(submission, "enqueue", lambda pk, queue: sent.append(pk))
    queued = server.analyst.submit("clinic", "count", epsilon=0.2)
    assert queued.status == "queued" and not queued.done
    reads = []

    def run_later():
        from django.db import connection

        from workers.tasks import run_request

        try:
            run_request.apply(args=[str(sent[0])])
        finally:
            connection.close()  # this thread's own connection

    timer = threading.Timer(0.3, run_later)
    timer.start()
    try:
        done = server.analyst.wait(queued, progress=reads.append, timeout=30)
    finally:
        timer.join()
    # it read the request queued, then (by long-poll or by polling) done
    assert done.status == "succeeded" and reads[0]["status"] == "queued" and reads[-1]["status"] == "succeeded"
    assert done.df["value"].notna().all()


def test_files_are_downloaded_and_checked(server, tmp_path, filedrop_engine):  # noqa: F811
    result = server.analyst.run("clinic", "files", engine="filedrop")
    assert result.files == ["answer.csv"]
    (path,) = result.download_all(tmp_path / "out")
    listed = result.result["files"][0]
    assert path.read_bytes().startswith(b"marker\nFILE-")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == listed["sha256"]


def test_requests_are_listed_and_retried_posts_are_not_charged_twice(server):
    c = server.analyst
    first = c.submit("clinic", "count", epsilon=0.4, idempotency_key="retry-1")
    again = c.submit("clinic", "count", epsilon=0.4, idempotency_key="retry-1")
    assert again.id == first.id and LedgerEntry.objects.count() == 1
    assert [r.id for r in c.requests(kind="count")] == [first.id]
    assert Request.objects.count() == 1
