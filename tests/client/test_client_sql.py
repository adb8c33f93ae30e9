"""The client's SQL against a live server: several aggregates as one charged request with
named columns, dummy=True on DuckDB (free, same columns), the privacy-client command line;
and, without a server, typed errors for an unreachable or silent service."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from governance.models import LedgerEntry, Request

from tests.conftest import small_frame

from .conftest import SCHEMA, make_client

QUERY = ("SELECT site, COUNT(*) AS n, AVG(income) AS mean_income, MEDIAN(age) AS median_age FROM clinic "
         "WHERE age < 60 OR site = 'north' GROUP BY site ORDER BY site")


@pytest.mark.django_db(transaction=True)
def test_several_aggregates_are_one_request_with_named_columns_and_intervals(server):
    result = server.analyst.sql(QUERY, epsilon=0.9)
    df = result.df
    assert list(df.columns) == ["site", "n", "mean_income", "median_age", "n_ci_low", "n_ci_high",
                                "mean_income_ci_low", "mean_income_ci_high", "median_age_ci_low", "median_age_ci_high"]
    assert list(df["site"]) == sorted(["north", "south", "east", "west"])
    for c in ("n", "mean_income", "median_age"):
        assert (df[f"{c}_ci_low"] <= df[c]).all() and (df[c] <= df[f"{c}_ci_high"]).all()
    assert result.epsilon == pytest.approx(0.9, rel=1e-6)
    assert Request.objects.count() == 1 and LedgerEntry.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_dummy_runs_on_dummy_rows_with_duckdb_charging_nothing_in_the_same_shape(server):
    pytest.importorskip("duckdb")
    dummy = server.analyst.sql(QUERY, dummy=True, dummy_rows=200)
    assert not LedgerEntry.objects.exists() and not Request.objects.exists()
    real = server.analyst.sql(QUERY, epsilon=0.5)
    assert list(dummy.df.columns) == list(real.df.columns)
    assert dummy.raw["dummy"] is True and dummy.df["n"].sum() <= 200
    simple = server.analyst.sql("SELECT site, COUNT(*) FROM clinic GROUP BY site", dummy=True, dummy_rows=50)
    assert list(simple.df.columns) == ["value", "ci_low", "ci_high"] and simple.df.index.name == "site"
    assert simple.df["value"].sum() == 50
    # the key anywhere, or not selected at all: the same groups (a probe's were all 0)
    for sql in ["SELECT COUNT(*) FROM clinic GROUP BY site", "SELECT COUNT(*), site FROM clinic GROUP BY site",
                "SELECT COUNT(*) FROM clinic WHERE age BETWEEN SYMMETRIC (90) AND 0 GROUP BY site"]:
        other = server.analyst.sql(sql, dummy=True, dummy_rows=50)
        assert other.df["value"].tolist() == simple.df["value"].tolist(), sql
    means = server.analyst.sql("SELECT AVG(income), site FROM clinic GROUP BY site", dummy=True, dummy_rows=50)
    assert means.df["value"].notna().any() and means.df.index.name == "site"
    # the same checks as a real run: a literal outside the declared domain is refused
    import privacy_client as pc

    with pytest.raises(pc.InvalidRequest) as e:
        server.analyst.sql("SELECT COUNT(*) FROM clinic WHERE site = 'atlantis'", dummy=True)
    assert "where[0]" in e.value.errors


@pytest.mark.django_db(transaction=True)
def test_the_command_line_runs_prices_and_tries_a_query(server, capsys):
    from privacy_client import cli

    base = ["--url", server.url, "--token", server.tokens["ann"]]
    assert cli.main(base + ["sql", "SELECT site, COUNT(*) AS n FROM clinic GROUP BY site", "--estimate",
                            "--epsilon", "0.3"]) == 0
    assert '"would_admit": true' in capsys.readouterr().out and not LedgerEntry.objects.exists()
    assert cli.main(base + ["sql", "SELECT site, COUNT(*) AS n FROM clinic GROUP BY site", "--epsilon", "0.3",
                            "--format", "csv"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == ",site,n,n_ci_low,n_ci_high" and LedgerEntry.objects.count() == 1
    assert cli.main(base + ["sql", "SELECT STDDEV(age) FROM clinic", "--epsilon", "0.3"]) == 2
    err = capsys.readouterr().err
    assert "sql.unsupported" in err and "part: STDDEV" in err


def test_an_unreachable_service_is_a_typed_error_not_a_requests_exception():
    import privacy_client as pc

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = make_client(f"http://127.0.0.1:{port}", "t", retries=0)
    with pytest.raises(pc.ServerUnreachable) as e:
        client.datasets()
    assert e.value.code == "connection.failed" and isinstance(e.value, pc.ApiError)
    assert "Connection refused" in str(e.value) and e.value.url.startswith("http://127.0.0.1")


def test_a_silent_service_is_a_typed_timeout():
    import privacy_client as pc

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted = []
    stop = threading.Event()

    def accept():  # take connections, never answer
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        client = make_client(f"http://127.0.0.1:{listener.getsockname()[1]}", "t", timeout=0.3, retries=1)
        with pytest.raises(pc.ServerTimeout) as e:
            client.datasets()
        assert e.value.code == "connection.timeout" and isinstance(e.value, TimeoutError)
        with pytest.raises(pc.ServerUnreachable):  # a POST is retried (same Idempotency-Key), then raises
            client.submit_sql("SELECT COUNT(*) FROM clinic", epsilon=0.1)
        assert len(accepted) >= 3
    finally:
        stop.set()
        t.join()
        for c in accepted:
            c.close()
        listener.close()


def test_the_command_line_says_when_the_service_is_unreachable(capsys):
    from privacy_client import cli

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert cli.main(["--url", f"http://127.0.0.1:{port}", "--token", "t", "datasets"]) == 3
    assert "connection.failed" in capsys.readouterr().err


@pytest.mark.django_db(transaction=True)
def test_the_pandas_like_calls_take_dummy_too(server):
    pytest.importorskip("duckdb")
    dummy = server.analyst.mean("clinic", "income", by="site", where=[("age", ">=", 30), ("site", "in", ["north", "east"])],
                                dummy=True, dummy_rows=300)
    real = server.analyst.mean("clinic", "income", by="site", where=[("age", ">=", 30), ("site", "in", ["north", "east"])],
                               epsilon=0.5)
    assert list(dummy.df.columns) == list(real.df.columns) and dummy.df.index.name == real.df.index.name == "site"
    assert list(dummy.df.index) == list(real.df.index)  # every declared group, in the domain's order
    few = server.analyst.count("clinic", by="site", dummy=True, dummy_rows=2)  # some groups have no dummy row
    assert list(few.df.index) == ["north", "south", "east", "west"] and few.df["value"].sum() == 2
    ages = server.analyst.count("clinic", by="age", dummy=True, dummy_rows=5)  # an integer key: 18 to 90
    assert list(ages.df.index) == list(range(18, 91)) and ages.df["value"].sum() == 5
    assert server.analyst.count("clinic", dummy=True, dummy_rows=77).df["value"].iloc[0] == 77
    # an OR filter: priced as the count it is, so the frame is a count's (it was a query's)
    either = [{"or": [[("age", "<", 30)], [("site", "==", "east")]]}]
    ored = server.analyst.count("clinic", by="site", where=either, dummy=True, dummy_rows=300)
    assert list(ored.df.columns) == ["value", "ci_low", "ci_high"] and ored.df.index.name == "site"
    assert LedgerEntry.objects.count() == 1  # only the real one
    with pytest.raises(ValueError):
        server.analyst.histogram("clinic", "site", dummy=True)
    import privacy_client as pc

    with pytest.raises(pc.InvalidRequest):  # the service's refusal, as the real call's (a KeyError before)
        server.analyst.count("clinic", where=[("age", "~", 3)], dummy=True)


@pytest.mark.django_db(transaction=True)
def test_a_dataset_that_is_not_there_is_named_in_the_error(server):
    import privacy_client as pc

    with pytest.raises(pc.NotFound) as e:
        server.analyst.preview("nope")
    assert "'nope'" in str(e.value) and "datasets()" in str(e.value) and e.value.code == "not_found"
    with pytest.raises(pc.NotFound):
        server.analyst.dataset("nope")


@pytest.mark.parametrize("sql", ["SELECT AVG(`wage`) FROM `cps`", "INSERT INTO cps VALUES (1)"])
def test_dummy_without_a_dataset_it_can_find_is_a_sql_error_naming_from(sql):
    """A probe's got ``ValueError: ... pass dataset=``, an argument ``sql()`` does not have."""
    import privacy_client as pc

    with pytest.raises(pc.SqlError) as e:
        make_client("http://127.0.0.1:9", "t").sql(sql, dummy=True)
    assert e.value.part == "FROM" and "FROM dataset" in e.value.detail
    with pytest.raises(pc.SqlError) as e:  # an estimate too (it was a ValueError asking for dataset=)
        make_client("http://127.0.0.1:9", "t").estimate_sql(sql)
    assert e.value.part == "FROM"


@pytest.mark.django_db(transaction=True)
def test_an_estimate_of_sql_with_a_cte_names_with_not_a_missing_dataset(server):
    """The client took the CTE's name for the dataset: ``estimate_sql`` (and ``--estimate``)
    answered ``NotFound``; the service reads the SQL's own errors before the dataset."""
    import privacy_client as pc

    sql = "WITH t AS (SELECT * FROM clinic) SELECT COUNT(*) FROM t"
    for call in (lambda: server.analyst.estimate_sql(sql, epsilon=0.1),
                 lambda: server.analyst.sql(sql, epsilon=0.1, dummy=True)):
        with pytest.raises(pc.SqlUnsupported) as e:
            call()
        assert e.value.part == "WITH"


def test_the_dummy_client_renders_a_null_test_as_sql():
    from privacy_client import dummy

    sql, _ = dummy.sql_of("t", "aggregates", "count", {"where": [{"column": "x", "op": "is_null"},
                                                                  {"column": "y", "op": "is_not_null"}]})
    assert sql.endswith('WHERE "x" IS NULL AND "y" IS NOT NULL'), sql
    sql, _ = dummy.sql_of("t", "aggregates", "count", {"column": "x", "group_by": "g"})
    assert sql == 'SELECT "g", COUNT("x") FROM "t" GROUP BY "g"', sql


def test_the_dummy_client_renders_like_with_the_jsons_backslash_escape():
    import duckdb
    from privacy_client import dummy

    sql, _ = dummy.sql_of("t", "aggregates", "count", {"where": [{"column": "g", "op": "like", "value": "a\\%%"},
                                                                  {"column": "g", "op": "ilike", "value": "A%"}]})
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT * FROM (VALUES ('a%b'), ('ab'), ('A%')) v(g)")
    assert con.execute(sql).fetchone()[0] == 1, sql  # 'a%b' only: the JSON's \% is a literal %
    sql, _ = dummy.sql_of("t", "aggregates", "count", {"where": [{"column": "a", "op": "<", "value": {"column": "b"}}]})
    assert sql.endswith('WHERE "a" < "b"'), sql


@pytest.mark.django_db(transaction=True)
def test_count_of_a_column_counts_its_non_null_values(server, make_dataset, grant, analyst):
    """``client.count(dataset, column)`` and ``COUNT(column)`` in SQL are one request: the
    rows where the column is not null (they were a 400)."""
    from tests.conftest import small_frame

    frame = small_frame()
    frame.loc[frame.index % 4 == 0, "income"] = None  # 50 of the 200 incomes missing
    grant(analyst, make_dataset("wards", epsilon=1e6, frame=frame, schema=SCHEMA))
    call = server.analyst.count("wards", "income", epsilon=1e5)
    assert call.raw["params"]["column"] == "income" and call.raw["status"] == "succeeded"
    assert call.result["value"] == 150  # discrete noise of scale 1e-5: exact
    same = server.analyst.sql("SELECT COUNT(income) FROM wards", epsilon=1e5)
    assert same.raw["replayed"] and same.result["value"] == 150  # the same request: a free replay
    both = server.analyst.sql("SELECT site, COUNT(*) AS n, COUNT(income) AS paid FROM wards GROUP BY site",
                              epsilon=1e5)
    want = frame.groupby("site")["income"].agg(["size", "count"])
    got = both.df.set_index("site")
    for site in ("north", "south", "east"):
        assert (got.loc[site, "n"], got.loc[site, "paid"]) == tuple(want.loc[site]), site
    assert (got.loc["west", "n"], got.loc["west", "paid"]) == (0, 0)  # declared, no rows


def test_dummy_refuses_columns_differing_only_in_case():
    """DuckDB folds even quoted names: on columns "Grp" and "grp" a probe's dummy answers read
    one for the other, with no error. Dummy mode now says it cannot run there."""
    import pandas as pd

    from privacy_client import dummy

    class Stub:
        def preview(self, dataset, rows, seed):
            return pd.DataFrame({"Grp": ["a", "b"], "grp": ["p", "q"]})

    class Priced:
        request, raw = {"kind": "count", "params": {}}, {}

    with pytest.raises(ValueError, match="differ only in case"):
        dummy.run(Stub(), 'SELECT COUNT(*) FROM cs WHERE "grp" = \'p\'', "cs", estimate=Priced())


@pytest.mark.django_db(transaction=True)
def test_dummy_rows_of_integers_bounded_past_int64(server, make_dataset, grant, analyst):
    """Bounds of [0, 2^64] or [-1e19, 1e19] on an integer column: the preview drew with
    int64 and answered a 500 (Django's debug page), and every dummy query on the dataset
    failed with it (probe CQ)."""
    schema = {**SCHEMA, "big": {"lower": 0, "upper": 2**64, "integer": True},
              "wide": {"lower": -1e19, "upper": 1e19, "integer": True}}
    frame = small_frame(100, seed=4)
    frame["big"] = np.arange(100, dtype=np.uint64) * np.uint64(2**57)
    frame["wide"] = np.arange(100, dtype=np.int64) * 2**56
    grant(analyst, make_dataset("bigints", epsilon=5.0, unit_column="patient_id", schema=schema, frame=frame))
    body = server.analyst.preview("bigints", rows=200, seed=3)
    assert len(body) == 200 and all(isinstance(v, int) and 0 <= v <= 2**64 for v in body["big"])
    assert all(isinstance(v, int) and -10**19 <= v <= 10**19 for v in body["wide"])
    assert body["wide"].nunique() > 100 and (body["wide"] < 0).any() and (body["wide"] > 0).any()
    dummy = server.analyst.sql("SELECT site, COUNT(*) AS n FROM bigints GROUP BY site", dummy=True, dummy_rows=50)
    assert dummy.df["n"].sum() <= 50
