"""The client's result objects alone (no server): each engine's release as a DataFrame, the
budget left under the gating accountant."""

from __future__ import annotations

import pandas as pd
import pytest

from privacy_client import Dataset, Estimate, Result


def test_an_ungrouped_aggregate_is_one_row():
    df = Result({"engine": "aggregates", "kind": "sum", "status": "succeeded",
                 "result": {"kind": "sum", "value": 12.5, "ci95": [10.0, 15.0]}}).df
    assert df.to_dict("records") == [{"value": 12.5, "ci_low": 10.0, "ci_high": 15.0}]
    assert list(df.index) == ["sum"]


def test_a_histogram_is_indexed_by_bin_and_a_quantile_has_no_interval():
    hist = Result({"engine": "aggregates", "result": {"kind": "histogram", "column": "age", "groups": [
        {"key": "[18, 40)", "value": 3, "ci95": [1, 5]}, {"key": "[40, 90]", "value": 7, "ci95": [5, 9]}]}}).df
    assert hist.index.name == "bin" and list(hist["value"]) == [3, 7]
    q = Result({"engine": "aggregates", "result": {"kind": "quantile", "group_by": "site", "groups": [
        {"key": "north", "value": 40.0, "ci95": None}]}}).df
    assert q.index.name == "site" and q["ci_low"].isna().all()


def test_training_and_sweeps_give_their_tables_and_a_synthetic_result_says_where_its_table_is():
    train = Result({"engine": "dpsgd", "kind": "train", "result": {"history": [
        {"epoch": 1, "epsilon": 0.5, "val_accuracy": 0.7}, {"epoch": 2, "epsilon": 0.9, "val_accuracy": 0.75}],
        "files": [{"name": "model.pt", "bytes": 10, "sha256": "x"}]}})
    assert list(train.df["epsilon"]) == [0.5, 0.9] and train.files == ["model.pt"]
    sweep = Result({"engine": "dpsgd", "kind": "sweep", "result": {"table": [{"epsilon": 1, "accuracy": 0.7}]}})
    assert sweep.df.shape == (1, 2)
    synth = Result({"engine": "synthesis", "kind": "synthesize", "result": {"files": [
        {"name": "synthetic.csv"}]}})
    with pytest.raises(ValueError, match="synthetic.csv"):
        synth.df
    with pytest.raises(RuntimeError):
        synth.table()  # no client to download with


def test_remaining_epsilon_is_the_gating_accountants():
    ds = Dataset.from_json({"name": "d", "policy": "advanced", "budget": {"policy": "advanced", "accountants": {
        "basic": {"remaining_epsilon": 1.0}, "advanced": {"remaining_epsilon": 2.5},
        "rdp": {"remaining_epsilon": 3.0}}}})
    assert ds.remaining_epsilon == 2.5


def test_an_estimate_of_one_event_shows_it():
    est = Estimate.from_json({"events": [{"event": {"kind": "laplace", "epsilon": 0.1}}],
                              "total": {"basic": {"epsilon": 0.1}}, "would_admit": True, "fits": 9})
    assert est.event == {"kind": "laplace", "epsilon": 0.1} and est.epsilon == 0.1 and est.fits == 9


def test_a_sql_query_is_a_frame_of_its_named_columns_then_their_intervals():
    df = Result({"engine": "aggregates", "kind": "query", "result": {
        "kind": "query", "columns": ["region", "n", "mean_wage"], "rows": [["south", 10, 5.0], ["west", 7, 6.5]],
        "ci95": [[None, [8, 12], [4.0, 6.0]], [None, [5, 9], [5.5, 7.5]]],
        "aggregates": [{"name": "n"}, {"name": "mean_wage"}]}}).df
    assert list(df.columns) == ["region", "n", "mean_wage", "n_ci_low", "n_ci_high", "mean_wage_ci_low",
                                "mean_wage_ci_high"]
    assert df.iloc[1].tolist() == ["west", 7, 6.5, 5, 9, 5.5, 7.5]


def test_table_reads_the_csv_when_no_parquet_reader_is_installed(monkeypatch, tmp_path):
    import pandas as pd

    from privacy_client import results

    class Stub:
        def download(self, rid, name, path, sha256=None):
            assert name == "synthetic.csv"
            pd.DataFrame({"a": [1, 2]}).to_csv(path, index=False)
            return path

    monkeypatch.setattr(results, "_has_parquet", lambda: False)
    synth = Result({"id": "r", "engine": "synthesis", "kind": "synthesize",
                    "result": {"files": [{"name": "synthetic.parquet"}, {"name": "synthetic.csv"}]}}, Stub())
    assert synth.table(tmp_path)["a"].tolist() == [1, 2]


@pytest.mark.parametrize("name", ["../escaped.txt", "/tmp/abs.txt", "a/b.txt", "..", "", "a\\b"])
def test_a_file_name_from_the_service_that_is_not_a_plain_name_is_not_saved(tmp_path, name):
    """A hostile or impersonated server naming ``../escaped.txt`` (with its SHA-256) wrote
    outside the directory ``download_all`` was given."""

    class Sender:  # would serve any bytes: the name is refused before asking
        def download(self, *a, **kw):
            raise AssertionError("asked the service for a file it named badly")

    res = Result({"id": "r1", "engine": "dpsgd", "status": "succeeded",
                  "result": {"files": [{"name": name, "sha256": "0" * 64}]}}, client=Sender())
    with pytest.raises(ValueError, match="not a plain file name"):
        res.download_all(tmp_path / "here")
    assert not any((tmp_path / "here").iterdir()) and not (tmp_path / "escaped.txt").exists()


@pytest.mark.parametrize("sql,table", [
    ('SELECT COUNT(*) AS "from other" FROM clinic', "clinic"),
    ('SELECT site, COUNT(*) AS "n from x" FROM clinic GROUP BY site', "clinic"),
    ("SELECT COUNT(*) FROM clinic WHERE note = 'from x'", "clinic"),
    ("SELECT EXTRACT(YEAR FROM d) AS y, COUNT(*) FROM clinic GROUP BY y", "clinic"),
    ("SELECT /* from x */ COUNT(*) -- from y\nFROM clinic", "clinic"),
    ('select count(*) from "my-data"', "my-data"),
    ('SELECT COUNT(*) FROM "a""b"', 'a"b'),
])
def test_the_dataset_of_a_query_is_the_table_after_its_from(sql, table):
    """The server accepts an alias holding the word from; the client read its next word as
    the dataset and asked another dataset's estimate."""
    from privacy_client.client import _table_of

    assert _table_of(sql) == table


def test_interval_columns_are_floats_even_where_none_is_given():
    """A dummy run's intervals (and a quantile's) are None: the columns were of object dtype,
    and ``df.n - df.n_ci_low`` raised on them while it worked on a real result."""
    q = Result({"engine": "aggregates", "result": {"kind": "query", "columns": ["site", "n"], "rows": [["a", 3]],
                                                   "ci95": [[None, None]], "aggregates": [{"name": "n"}]}}).df
    assert q["n_ci_low"].dtype == float and (q.n - q.n_ci_low).isna().all()
    one = Result({"engine": "aggregates", "result": {"kind": "quantile", "value": 3.0, "ci95": None}}).df
    assert one["ci_low"].dtype == float


def test_names_the_analyst_chose_never_break_or_change_the_frame():
    """A probe's released, charged answers whose .df raised or changed a column: a group
    column named "value", an alias named like another's interval, a count aliased
    ``cyl_ci_low`` (made a float as if it were an interval)."""
    grouped = Result({"engine": "aggregates", "kind": "histogram", "result": {
        "kind": "histogram", "group_by": "value", "groups": [
            {"key": "a", "value": 3, "ci95": [1, 5]}, {"key": "b", "value": 4, "ci95": [2, 6]}]}}).df
    assert grouped.index.name == "value" and grouped.index.tolist() == ["a", "b"]
    assert grouped["value"].tolist() == [3, 4] and grouped["ci_low"].tolist() == [1.0, 2.0]
    df = Result({"engine": "aggregates", "kind": "query", "result": {
        "kind": "query", "columns": ["n", "n_ci_low"], "rows": [[10, 5.5]],
        "ci95": [[[8, 12], [4.0, 7.0]]], "aggregates": [{"name": "n"}, {"name": "n_ci_low"}]}}).df
    assert list(df.columns) == ["n", "n_ci_low", "n_ci_low_", "n_ci_high", "n_ci_low_ci_low", "n_ci_low_ci_high"]
    assert df.iloc[0].tolist() == [10, 5.5, 8.0, 12.0, 4.0, 7.0]
    counted = Result({"engine": "aggregates", "kind": "query", "result": {
        "kind": "query", "columns": ["cyl", "cyl_ci_low"], "rows": [[4, 11], [6, 7]],
        "ci95": [[None, [9, 13]], [None, [5, 9]]], "aggregates": [{"name": "cyl_ci_low"}]}}).df
    assert counted["cyl_ci_low"].tolist() == [11, 7] and counted["cyl_ci_low"].dtype.kind == "i"
    assert counted["cyl_ci_low_ci_low"].tolist() == [9.0, 5.0]


def test_dummy_sql_spells_between_symmetric_for_duckdb():
    """The service takes BETWEEN SYMMETRIC (docs/engines.md); DuckDB does not, and dummy=True
    raised its raw ParserException (a probe)."""
    import duckdb

    from privacy_client.dummy import duckdb_sql

    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range * 10 AS wage FROM range(200)")
    for sql in ("SELECT COUNT(*) FROM t WHERE wage BETWEEN SYMMETRIC 900 AND 100",
                "SELECT COUNT(*) FROM t WHERE wage between symmetric 100 and 900"):
        assert con.execute(duckdb_sql(sql)).fetchall() == [(81,)]


def test_dummy_sql_rewrites_no_quoted_text():
    """A label 'MIN(x)' came back as 'QUANTILE_CONT(x, 0.01)' on dummy rows, and a filter
    site = 'MAX(x)' would have matched other rows than on the service (a probe)."""
    import duckdb

    from privacy_client.dummy import duckdb_sql

    sql = ("SELECT CASE WHEN age < 30 THEN 'MIN(x)' ELSE 'it''s VARIANCE(y)' END AS \"MAX(z)\", MIN(age) "
           "FROM t WHERE site = 'MAX(x)' AND age BETWEEN SYMMETRIC 'b' AND 'a'")
    got = duckdb_sql(sql)
    assert got == ("SELECT CASE WHEN age < 30 THEN 'MIN(x)' ELSE 'it''s VARIANCE(y)' END AS \"MAX(z)\", "
                   "QUANTILE_CONT(age, 0.01) FROM t WHERE site = 'MAX(x)' AND age BETWEEN LEAST('b', 'a') AND "
                   "GREATEST('b', 'a')")
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range AS age, 'MAX(x)' AS site FROM range(50)")
    assert con.execute(duckdb_sql("SELECT 'MIN(x)' AS label, COUNT(*) FROM t WHERE site = 'MAX(x)'")).fetchall() \
        == [("MIN(x)", 50)]


def test_a_list_paged_while_it_grows_gives_each_item_once(monkeypatch):
    """Lists are newest first: requests created while the client pages shift older ones
    onto the next page, which the client listed twice (a probe: 169 listed, 144 distinct)."""
    from privacy_client import Client

    made = [0]

    def call(self, method, path, params=None, **kw):
        made[0] += 3  # three new requests before each page is read
        ids = list(range(100 + made[0], 0, -1))  # newest first
        size, page = params["page_size"], params["page"]
        chunk = ids[(page - 1) * size: page * size]
        return {"results": [{"id": i} for i in chunk], "next": "more" if page * size < len(ids) else None}

    monkeypatch.setattr(Client, "_call", call)
    client = Client.__new__(Client)
    got = [r["id"] for r in client._pages("/api/requests/", {"page_size": 10})]
    assert len(got) == len(set(got)) and set(range(1, 101)) <= set(got)


def test_the_shell_prints_no_control_character_a_terminal_acts_on():
    """A dataset title or a declared category with ESC sequences (clear the screen, set the
    window title) was printed raw as a table; the CSV left a lone CR unquoted. The table
    shows them as escapes; the CSV quotes such cells and keeps the values."""
    import csv
    import io

    from privacy_client.cli import _print_frame

    df = pd.DataFrame({"title": ["\x1b]0;pwned\x07\x1b[2J", "\u009b31m", "\r=2+2"], "n": [1, 2, 3]}).set_index("title")
    for fmt in ("table", "json"):
        out = io.StringIO()
        _print_frame(df, fmt, out)
        assert not [c for c in out.getvalue() if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) < 0xa0], fmt
    out = io.StringIO()
    _print_frame(df, "csv", out)
    rows = list(csv.reader(io.StringIO(out.getvalue(), newline="")))
    assert [r[0] for r in rows] == ["title", *df.index]


def test_train_takes_params_and_refuses_dummy_by_what_it_is(monkeypatch):
    """``train(..., params={...})`` was a TypeError (params given twice), and
    ``train(..., dummy=True)`` a service error about a parameter nobody gave ("unknown
    parameter(s) for train: epsilon"): dummy runs only aggregates (a helper's probe)."""
    from privacy_client import Client

    client = Client("http://127.0.0.1:9", token="t")
    sent = []
    monkeypatch.setattr(client, "_run", lambda body, *a: sent.append(body))
    client.train("mroz", "lfp", params={"epochs": 2}, target_epsilon=1.5)
    assert sent[0]["params"] == {"epochs": 2, "target": "lfp", "target_epsilon": 1.5}
    for call in (lambda: client.train("mroz", "lfp", target_epsilon=1.5, dummy=True),
                 lambda: client.synthesize("mroz", epsilon=1, dummy=True)):
        with pytest.raises(ValueError, match="dummy=True runs aggregates"):
            call()
