"""The client's result objects alone (no server): each engine's release as a DataFrame, the
budget left under the gating accountant."""

from __future__ import annotations

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
