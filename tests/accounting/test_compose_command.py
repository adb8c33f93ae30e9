"""``manage.py compose``: events from a file or standard input, JSON out, CommandError for
anything wrong with the input."""

import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from accounting import ACCOUNTANTS, parse_events

ROOT = Path(__file__).resolve().parents[2]
EVENTS = [
    {"kind": "laplace", "epsilon": 0.5},
    {"kind": "self_composed", "event": {"kind": "laplace", "epsilon": 0.05}, "count": 10},
    {"kind": "gaussian", "noise_multiplier": 8.0},
    {"kind": "epsilon_delta", "epsilon": 0.1, "delta": 1e-8},
    {"kind": "no_op"},
]


def run(*args, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    out = io.StringIO()
    call_command("compose", *args, stdout=out)
    return json.loads(out.getvalue())


@pytest.fixture
def events_file(tmp_path):
    path = tmp_path / "events.json"
    path.write_text(json.dumps(EVENTS))
    return path


@pytest.mark.parametrize("accountant", sorted(ACCOUNTANTS))
def test_it_prints_the_composition_of_a_file(events_file, accountant):
    got = run(str(events_file), "--delta", "1e-5", "--accountant", accountant)
    expected = ACCOUNTANTS[accountant].compose(parse_events(EVENTS), 1e-5)
    assert got == {"epsilon": expected.epsilon, "delta": expected.delta}
    assert 1.0 < got["epsilon"] < math.inf


@pytest.mark.parametrize("accountant", sorted(ACCOUNTANTS))
def test_it_reads_standard_input(monkeypatch, accountant):
    got = run("-", "--delta", "1e-5", "--accountant", accountant, stdin=json.dumps(EVENTS), monkeypatch=monkeypatch)
    expected = ACCOUNTANTS[accountant].compose(parse_events(EVENTS), 1e-5)
    assert got == {"epsilon": expected.epsilon, "delta": expected.delta}


def test_the_default_accountant_is_rdp(events_file):
    assert run(str(events_file), "--delta", "1e-5") == run(str(events_file), "--delta", "1e-5", "--accountant", "rdp")


def test_basic_composition_of_ten_tenths_is_one(monkeypatch):
    data = json.dumps({"kind": "self_composed", "event": {"kind": "laplace", "epsilon": 0.1}, "count": 10})
    assert run("-", "--delta", "0", "--accountant", "basic", stdin=data, monkeypatch=monkeypatch) == {
        "epsilon": 1.0, "delta": 0.0}


@pytest.mark.parametrize("accountant", sorted(ACCOUNTANTS))
def test_a_non_private_release_prints_inf(monkeypatch, accountant):
    got = run("-", "--delta", "1e-5", "--accountant", accountant,
              stdin='[{"kind": "non_private"}]', monkeypatch=monkeypatch)
    assert got["epsilon"] == "inf"


def test_a_missing_file_is_a_command_error(tmp_path):
    with pytest.raises(CommandError, match="cannot read"):
        run(str(tmp_path / "nope.json"), "--delta", "1e-5")


def test_a_directory_is_a_command_error(tmp_path):
    with pytest.raises(CommandError, match="cannot read"):
        run(str(tmp_path), "--delta", "1e-5")


@pytest.mark.parametrize("text", ["", "[{", "{'kind': 'no_op'}", "not json"])
def test_bad_json_is_a_command_error(tmp_path, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(CommandError, match="is not JSON"):
        run(str(path), "--delta", "1e-5")


@pytest.mark.parametrize("data, message", [
    ([{"kind": "exponential"}], "unknown kind 'exponential'"),
    ([{"kind": "laplace", "epsilon": -1}], "'epsilon' must be > 0"),
    ([{"kind": "no_op"}, {"kind": "gaussian"}], "events[1]: 'noise_multiplier' is required"),
    ("laplace", "expected an event object or a list of events"),
])
def test_a_bad_event_is_a_command_error(monkeypatch, data, message):
    with pytest.raises(CommandError) as e:
        run("-", "--delta", "1e-5", stdin=json.dumps(data), monkeypatch=monkeypatch)
    assert message in str(e.value)


@pytest.mark.parametrize("delta", ["1", "1.5", "-0.1", "nan"])
def test_a_delta_outside_zero_one_is_a_command_error(events_file, delta):
    with pytest.raises(CommandError, match="delta must be in"):
        run(str(events_file), "--delta", delta)


def test_bad_arguments_are_command_errors(events_file):
    with pytest.raises(CommandError):
        run(str(events_file))  # --delta is required
    with pytest.raises(CommandError):
        run(str(events_file), "--delta", "1e-5", "--accountant", "moments")


def test_help_shows_the_event_format():
    result = subprocess.run([sys.executable, "manage.py", "compose", "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Event format" in result.stdout
    for kind in ("laplace", "gaussian", "subsampled_gaussian", "epsilon_delta", "self_composed",
                 "composed", "no_op", "non_private"):
        assert f'"kind": "{kind}"' in result.stdout
    assert "--accountant {advanced,basic,rdp}" in result.stdout


def test_it_runs_as_a_pipe():
    result = subprocess.run([sys.executable, "manage.py", "compose", "-", "--delta", "0", "--accountant", "basic"],
                            cwd=ROOT, input='[{"kind": "laplace", "epsilon": 0.25}, {"kind": "laplace", "epsilon": 0.5}]',
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"epsilon": 0.75, "delta": 0.0}


@pytest.mark.django_db
def test_a_datasets_committed_history_is_composed_off_the_grid(make_dataset, officer):
    from governance.ledger import actions as ledger, limits

    ds = make_dataset(epsilon=5.0, delta=1e-5)
    for event in ({"kind": "subsampled_gaussian", "sample_rate": 0.001, "noise_multiplier": 1.5, "steps": 1000},
                  {"kind": "laplace", "epsilon": 0.05}):
        ledger.commit(ledger.admit(ds, officer, event))
    ledger.release(ledger.admit(ds, officer, {"kind": "laplace", "epsilon": 1.0}))  # refunded: not composed
    got = run("--dataset", ds.name)
    assert got["releases"] == 2 and got["delta"] == 1e-5
    assert got["epsilon"] < 0.97 * got["ledger_epsilon"]  # the grid's gap, recovered
    assert got["ledger_epsilon"] == pytest.approx(limits.budget_report(
        ledger.recompute_state(ds.pk), ledger.Limit.of_dataset(ds))["rdp"]["epsilon"], rel=1e-12)
    basic = run("--dataset", ds.name, "--accountant", "basic", "--delta", "1e-5")
    assert basic["epsilon"] == pytest.approx(basic["ledger_epsilon"])
    with pytest.raises(CommandError, match="no dataset"):
        run("--dataset", "nope")
    with pytest.raises(CommandError, match="either a file"):
        run("x.json", "--dataset", ds.name)


def test_a_file_of_costly_events_is_refused_before_any_curve_past_max_work(tmp_path, monkeypatch):
    """The API refused 2,000 distinct subsampled Gaussians in 0.08 s; the command composed
    them for 93 s with no bound. Now it counts first, as the API does, against --max-work."""
    from accounting import rdp_math, work
    from tests.accounting.test_work import SeriesCounter

    rdp_math._one_step_curve.cache_clear()
    rdp_math._SERIES.clear()
    series = SeriesCounter(monkeypatch)
    path = tmp_path / "events.json"
    path.write_text(json.dumps([{"kind": "subsampled_gaussian", "sample_rate": 0.001 + i * 1e-5,
                                 "noise_multiplier": 1.0 + i * 1e-3, "steps": 100} for i in range(2000)]))
    with pytest.raises(CommandError, match="--max-work 1"):
        run(str(path), "--delta", "1e-5", "--max-work", "1")
    assert series.orders == 0
    cheap = tmp_path / "cheap.json"
    cheap.write_text(json.dumps(EVENTS))
    assert run(str(cheap), "--delta", "1e-5", "--max-work", "1") == run(str(cheap), "--delta", "1e-5",
                                                                          "--max-work", "0")
    assert work.active() is None  # the bound closed with the command


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "x"])
def test_max_work_must_be_a_number_of_seconds(events_file, value):
    with pytest.raises(CommandError, match="max-work"):
        run(str(events_file), "--delta", "1e-5", "--max-work", value)
