"""The DP-VAE synthesis method (engines/synthesis/vae.py) through ``engines.plugins.plan``
and ``engines.plugins.run``, on a small table with 2 numeric and 2 categorical columns:
the plan's event and its epsilon, a refused tiny epsilon, a run's table (rows, columns,
types, bounds, domains, a learnt dependency), cancellation carrying the steps done, a
refused unit-column dataset, and the privacy-critical parts checked against their
definitions: each unit's gradient (both networks together) clipped separately, written as
a brute-force loop over units in float64, and the noise's scale.

The engine seeds its generator from os.urandom; the run tests replace it by a seeded one
(``seeded``) and seed torch's global generator (model initialisation, the reparameterisation
noise) so a run is reproducible."""

import copy

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from accounting import rdp
from accounting.base import compose_events
from accounting.events import parse_event
from engines import plugins
from engines.dpsgd import calibrate
from engines.synthesis import vae
from engines.synthesis.params import Spec
from engines.types import Cancelled, DatasetMeta, EngineError, EngineRequest, PlanError
from tests.engines.dpsgd_helpers import one_thread  # noqa: F401  (autouse)

N = 2000
DELTA = 1e-5
COLUMNS = {
    "score": {"type": "numeric", "lower": 0, "upper": 100},
    "kids": {"type": "numeric", "lower": 0, "upper": 10, "integer": True},
    "grp": {"type": "categorical", "domain": ["a", "b", "c"]},
    "flag": {"type": "categorical", "domain": ["yes", "no"]},
    "pid": {"type": "unit"},
}
MEANS = {"a": 20.0, "b": 50.0, "c": 80.0}  # score depends strongly on grp
GENEROUS = {"method": "vae", "epsilon": 8.0, "epochs": 8, "batch_size": 100, "latent_dim": 4, "hidden": [32],
            "learning_rate": 0.03, "rows": 3000, "holdout_fraction": 0.0}


def make_table(n=N, seed=0) -> pa.Table:
    rng = np.random.default_rng(seed)
    grp = rng.choice(["a", "b", "c"], n)
    score = np.array([MEANS[g] for g in grp]) + rng.normal(0, 6, n)
    score[rng.random(n) < 0.1] = np.nan
    kids = rng.integers(0, 6, n).astype(float)
    flag = rng.choice(["yes", "no", "maybe"], n, p=[0.6, 0.35, 0.05])  # "maybe": outside the domain
    pid = rng.integers(0, n // 4, n)
    return pa.table({"score": score, "kids": kids, "grp": grp, "flag": flag, "pid": pid})


def meta(unit=False) -> DatasetMeta:
    cols = COLUMNS if unit else {k: v for k, v in COLUMNS.items() if k != "pid"}
    return DatasetMeta(name="small", columns=cols, unit_column="pid" if unit else None, n_rows=N,
                       n_units=N // 4 if unit else N, delta=DELTA)


@pytest.fixture(scope="module")
def table():
    return make_table()


@pytest.fixture(scope="module")
def plan():
    return plugins.plan("synthesis", EngineRequest("synthesize", GENEROUS), meta())


@pytest.fixture
def seeded(monkeypatch):
    seeds = iter(range(1000, 2000))
    monkeypatch.setattr(vae, "secure_generator", lambda dev: torch.Generator(device=dev).manual_seed(next(seeds)))
    torch.manual_seed(0)


def run(plan, table, tmp_path, progress=lambda info: None, ds=None):
    return plugins.run("synthesis", EngineRequest("synthesize", GENEROUS), ds or meta(), table, plan, progress,
                       workdir=tmp_path)


# ---------------------------------------------------------------- planning


def test_the_plan_is_the_subsampled_gaussian_of_the_run_at_the_requested_epsilon(plan):
    d = plan.details["vae"]
    n_train = N  # holdout_fraction 0
    assert d["sample_rate"] == pytest.approx(100 / n_train)
    assert d["steps_per_epoch"] == 20 and d["steps"] == 8 * 20
    assert plan.event == {"kind": "subsampled_gaussian", "sample_rate": d["sample_rate"],
                          "noise_multiplier": d["noise_multiplier"], "steps": d["steps"]}
    # calibrated, reported and charged at the refined order, as DP-SGD training (the ledger's
    # refined_epsilon of the charged event), tight to the target
    refined = rdp.compose([parse_event(plan.event)], DELTA).epsilon
    assert 0.999 * 8.0 <= refined <= 8.0
    assert plan.details["planned_epsilon"] == refined == plan.details["certified_epsilon"]
    grid = compose_events(rdp, [parse_event(plan.event)], DELTA).epsilon  # the gate's filter: never less
    assert refined <= grid
    assert d["noise_multiplier"] == calibrate.noise_multiplier(8.0, DELTA, d["sample_rate"], d["steps"])
    assert d["noise_multiplier"] <= calibrate.grid_noise_multiplier(8.0, DELTA, d["sample_rate"], d["steps"])
    assert plan.columns == ["score", "kids", "grp", "flag"]


@settings(max_examples=5, deadline=None)
@given(epsilon=st.floats(0.5, 8.0), batch=st.sampled_from([50, 100, 400]), epochs=st.integers(1, 6))
def test_the_planned_epsilon_is_the_charged_events_refined_epsilon_and_meets_the_target(epsilon, batch, epochs):
    plan = plugins.plan("synthesis", EngineRequest("synthesize", {**GENEROUS, "epsilon": epsilon,
                                                                   "batch_size": batch, "epochs": epochs}), meta())
    refined = rdp.compose([parse_event(plan.event)], DELTA).epsilon
    assert plan.details["planned_epsilon"] == refined <= epsilon * (1 + 1e-9)
    assert refined >= 0.99 * epsilon or plan.details["vae"]["noise_multiplier"] <= calibrate.MIN_NOISE  # as DP-SGD
    assert refined <= compose_events(rdp, [parse_event(plan.event)], DELTA).epsilon


def test_a_tiny_epsilon_is_refused_at_plan_time():
    with pytest.raises(PlanError) as exc:
        plugins.plan("synthesis", EngineRequest("synthesize", {**GENEROUS, "epsilon": 1e-4}), meta())
    assert "epsilon" in exc.value.errors
    assert "too small" in exc.value.errors["epsilon"]


# ---------------------------------------------------------------- a run


def test_a_run_returns_the_requested_table_within_the_declared_schema(plan, table, tmp_path, seeded):
    seen = []
    release = run(plan, table, tmp_path, seen.append)
    result = release.result
    assert result["method"] == "vae" and result["rows"] == 3000
    assert result["columns"] == ["score", "kids", "grp", "flag"]
    info = result["vae"]
    assert info["steps"] == plan.details["vae"]["steps"] and info["epochs"] == 8
    assert info["noise_multiplier"] == plan.details["vae"]["noise_multiplier"]
    assert "final_loss" not in info  # the private training loss is never released
    assert release.actual_event is None  # every planned step ran

    training = [s for s in seen if s["phase"] == "training the VAE"]
    assert training and training[-1]["epoch"] == 8 and all(s["epochs"] == 8 for s in training)
    assert all(0 <= s["fraction"] < 1 for s in seen)
    assert [s["fraction"] for s in training] == sorted(s["fraction"] for s in training)

    df = pd.read_parquet(tmp_path / "synthetic.parquet")
    assert list(df.columns) == ["score", "kids", "grp", "flag"] and len(df) == 3000
    # kids is declared integer: written as integers (2, not 2.0), with its nulls
    assert df["score"].dtype == np.float64 and df["kids"].dtype == "Int64"
    score, kids = df["score"].dropna(), df["kids"].dropna()
    assert score.between(0, 100).all() and kids.between(0, 10).all()
    assert (kids == np.floor(kids)).all()  # an integer column
    assert set(df["grp"].dropna()) <= {"a", "b", "c"} and set(df["flag"].dropna()) <= {"yes", "no"}
    assert 0.02 < df["score"].isna().mean() < 0.3  # about 10% null in the data
    assert 0.2 < (df["flag"] == "yes").mean() < 0.9

    # The dependency is partly learnt: score's mean by group is in the right order, well apart.
    by = df.dropna(subset=["score", "grp"]).groupby("grp")["score"].mean()
    assert by["a"] + 10 < by["b"] < by["c"] - 10, by.to_dict()


def test_a_cancellation_mid_training_charges_the_steps_done(plan, table, tmp_path, seeded):
    fractions = []

    def progress(info):
        if info["phase"] == "training the VAE":
            fractions.append(info["fraction"])
            if info["epoch"] >= 3:
                raise Cancelled("stop")

    with pytest.raises(Cancelled) as exc:
        run(plan, table, tmp_path, progress)
    actual = exc.value.actual_event
    planned = plan.details["vae"]
    assert actual["kind"] == "subsampled_gaussian"
    assert actual["sample_rate"] == planned["sample_rate"] and actual["noise_multiplier"] == planned["noise_multiplier"]
    assert 2 * planned["steps_per_epoch"] < actual["steps"] <= 3 * planned["steps_per_epoch"] < planned["steps"]
    assert not (tmp_path / "synthetic.parquet").exists()


@pytest.mark.parametrize("phase", ["preparing data", "training the VAE"])
def test_a_cancellation_before_the_first_step_charges_nothing(plan, table, tmp_path, seeded, phase):
    """Heard at the first step's report, or while the data was prepared (engines/types
    before_the_first_step; the second was charged the whole plan)."""
    def progress(info):
        if info["phase"] == phase:
            raise Cancelled("stop")

    with pytest.raises(Cancelled) as exc:
        run(plan, table, tmp_path, progress)
    assert exc.value.actual_event == {"kind": "no_op"}


def test_a_dataset_with_a_unit_column_trains_on_units(table, tmp_path):
    ds = meta(unit=True)
    params = {**GENEROUS, "batch_size": 25}  # q = 25 / 500 units: the same calibration as ``plan``
    p = plugins.plan("synthesis", EngineRequest("synthesize", params), ds)
    spec = Spec.from_dict(p.details["spec"])
    df = table.to_pandas()
    # Without each row's unit the VAE cannot clip per unit: it refuses.
    with pytest.raises(EngineError, match="privacy unit"):
        vae.synthesize(df[spec.names], spec, p.details["vae"], lambda info: None)
    # The engine passes the units (execute.split): units are sampled and clipped whole.
    release = plugins.run("synthesis", EngineRequest("synthesize", params), ds, table, p, lambda info: None,
                          workdir=tmp_path)
    assert release.result["rows"] == spec.rows and release.result["vae"]["steps"] == p.details["vae"]["steps"]
    synthetic, info = vae.synthesize(df[spec.names], spec, p.details["vae"], lambda info: None,
                                     units=df["pid"].to_numpy())
    assert len(synthetic) == spec.rows and list(synthetic.columns) == spec.names


# ---------------------------------------------------------------- clipping and noise, by definition


def small_batch(head, n=24, seed=3, hidden=(5, 4)):
    """A float64 VAE on the table's columns and a batch with nulls and out-of-domain values."""
    spec_cols = [{"column": k, **v, **({"bins": 7, "integer": v.get("integer", False)} if v["type"] == "numeric"
                                       else {})} for k, v in COLUMNS.items() if v["type"] != "unit"]
    layout = vae.Layout(spec_cols, head)
    df = make_table(n, seed).to_pandas()
    data = {k: torch.from_numpy(a) for k, a in layout.encode(df).items()}
    data = {k: (v.double() if v.is_floating_point() else v) for k, v in data.items()}
    torch.manual_seed(seed)
    model = vae.VAE(layout, 3, list(hidden)).double()
    return model, data


def brute_force(model, data, noise, rows_of_units, max_norm):
    """sum over units of clip(the unit's gradient over all parameters, max_norm), one
    ordinary forward and backward pass of the unit's rows at a time."""
    total = [torch.zeros_like(p) for p in model.parameters()]
    for rows in rows_of_units:
        model.zero_grad()
        batch = {k: v[rows] for k, v in data.items()}
        model.row_losses(batch, noise[rows]).sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        factor = min(1.0, max_norm / (float(norm) + 1e-6))
        for t, g in zip(total, grads):
            t.add_(g * factor)
    return total


@pytest.mark.parametrize("head", ["bins", "gaussian"])
def test_one_step_clips_each_rows_gradient_over_both_networks(head, monkeypatch):
    model, data = small_batch(head)
    n = len(data["x"])
    noise = torch.randn(n, model.latent_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    trainer = vae.DPTrainer(model, data, q=0.5, z=1.0, expected_units=n, learning_rate=1e-3,
                            gen=torch.Generator().manual_seed(2))
    rows = torch.arange(n)
    monkeypatch.setattr(vae, "MAX_GRAD_NORM", 1e9)
    norms = trainer.clipped_sum(rows, noise=noise)
    c = float(norms.median())  # about half the rows are clipped
    assert (norms > c * (1 + 1e-3)).any() and (norms < c * (1 - 1e-3)).any()
    monkeypatch.setattr(vae, "MAX_GRAD_NORM", c)
    trainer.clipped_sum(rows, noise=noise)
    got = [p.grad.clone() for p in model.parameters()]
    want = brute_force(copy.deepcopy(model), data, noise, [[i] for i in range(n)], c)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-7, atol=1e-6 * n)
    # and the per-row norms are the full gradients' norms
    ref = brute_force(copy.deepcopy(model), data, noise, [[0]], 1e9)
    assert float(norms[0]) == pytest.approx(float(torch.sqrt(sum(r.pow(2).sum() for r in ref))), rel=1e-9)


def test_one_step_clips_each_units_gradient_when_units_are_given(monkeypatch):
    model, data = small_batch("bins", n=30)
    n = len(data["x"])
    units = np.random.default_rng(4).integers(0, 9, n)  # 9 units of several rows each
    unit_t, pad, n_units = vae._groups(units, torch.device("cpu"))
    noise = torch.randn(n, model.latent_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    trainer = vae.DPTrainer(model, data, q=1.0, z=1.0, expected_units=n_units, learning_rate=1e-3,
                            gen=torch.Generator().manual_seed(2), units=unit_t, pad=pad, n_units=n_units)
    rows, unit_of_row, sel_pad, n_sel = trainer.sample()  # q = 1: every unit
    assert n_sel == n_units and sorted(rows.tolist()) == list(range(n))
    monkeypatch.setattr(vae, "MAX_GRAD_NORM", 1e9)
    norms = trainer.clipped_sum(rows, unit_of_row, sel_pad, n_sel, noise=noise[rows])
    c = float(norms.median())
    monkeypatch.setattr(vae, "MAX_GRAD_NORM", c)
    trainer.clipped_sum(rows, unit_of_row, sel_pad, n_sel, noise=noise[rows])
    got = [p.grad.clone() for p in model.parameters()]
    codes = unit_t.numpy()
    want = brute_force(copy.deepcopy(model), data, noise, [np.nonzero(codes == u)[0] for u in range(n_units)], c)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-7, atol=1e-6 * n_units)


def test_an_empty_sample_steps_on_noise_of_std_z_c_over_the_expected_batch(monkeypatch):
    model, data = small_batch("bins", n=10, hidden=(16,))
    n_expected, z, q = 400.0, 3.0, 1e-12  # q: the sample is empty
    trainer = vae.DPTrainer(model, data, q=q, z=z, expected_units=n_expected / q, learning_rate=1e-3,
                            gen=torch.Generator().manual_seed(5))
    grads = []
    monkeypatch.setattr(trainer.opt, "step", lambda: grads.extend(p.grad.flatten() for p in trainer.params))
    trainer.step()
    g = torch.cat(grads)
    assert len(g) > 300
    assert float(g.std()) == pytest.approx(z * vae.MAX_GRAD_NORM / n_expected, rel=0.15)
    assert abs(float(g.mean())) < 4 * z / n_expected / len(g) ** 0.5
    assert trainer.steps == 1


def test_encoding_reads_only_the_declared_schema():
    """The same rows give the same encoding whatever the rest of the table holds (no statistic
    of the data enters), with a null flag for every numeric column even without nulls."""
    layout = vae.Layout([{"column": "v", "type": "numeric", "lower": -1.0, "upper": 3.0, "bins": 4, "integer": False},
                         {"column": "c", "type": "categorical", "domain": ["p", "q"]}], "bins")
    df = pd.DataFrame({"v": [-5.0, 0.0, 3.0, np.nan], "c": ["q", None, "r", "p"]})
    enc = layout.encode(df)
    np.testing.assert_allclose(enc["x"], [[-1, 0, 0, 1, 0], [-0.5, 0, 0, 0, 1], [1, 0, 0, 0, 1], [0, 1, 1, 0, 0]])
    np.testing.assert_array_equal(enc["code"], [[0, 1], [1, 2], [3, 2], [4, 0]])
    more = pd.concat([df, pd.DataFrame({"v": [100.0] * 5, "c": ["p"] * 5})])
    np.testing.assert_array_equal(layout.encode(more)["x"][:4], enc["x"])
    assert layout.n_in == 5 and layout.n_out == (4 + 1) + 3
    assert vae.Layout(layout.columns, "gaussian").n_out == 3 + 3
