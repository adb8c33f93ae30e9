"""Statistical checks: the noise the engine adds has the declared distribution and scale.

OpenDP's samplers cannot be seeded, so every check uses a threshold that a correct
implementation fails with probability below 1e-6: KS tests at p < 1e-7 (conservative
for discrete distributions), coverage checks at about 5 binomial standard deviations.
``test_the_ks_check_has_power`` shows the same check rejects a scale off by 2x.
"""

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from scipy import stats

from engines import plugins
from engines.aggregates import compute, noise
from engines.types import DatasetMeta, EngineRequest

DRAWS = 2000
P_FAIL = 1e-7
DS = DatasetMeta("n", {"x": {"type": "numeric", "lower": -5, "upper": 10},
                       "g": {"type": "categorical", "domain": [f"g{i}" for i in range(400)]}},
                 None, 8, 8, 1e-6)
TABLE = pa.table({"x": [1.0, 2.0, 3.0, 4.0, 100.0, -7.0, None, 0.5], "g": ["g1"] * 8})
TRUE = {"count": 8, "sum": 1 + 2 + 3 + 4 + 10 - 5 + 0.5}


def draws(kind, params, n=DRAWS):
    """n noisy answers of one planned query (ungrouped) and the result of the last run."""
    req = EngineRequest(kind, params)
    plan = plugins.plan("aggregates", req, DS)
    out, result = [], None
    for _ in range(n):
        result = plugins.run("aggregates", req, DS, TABLE, plan, lambda p: None).result
        out.append(result["value"])
    return np.asarray(out, dtype=float), result, plan


def grouped_draws(kind, params, runs=5):
    """Noise on 400 groups per run (all true values known): runs * 400 draws of the vector mechanism."""
    req = EngineRequest(kind, {**params, "group_by": "g"})
    plan = plugins.plan("aggregates", req, DS)
    truth = np.zeros(400)
    truth[1] = TRUE[kind]
    out = []
    for _ in range(runs):
        result = plugins.run("aggregates", req, DS, TABLE, plan, lambda p: None).result
        out.append(np.array([g["value"] for g in result["groups"]], dtype=float) - truth)
    return np.concatenate(out), result


def discrete_gaussian(sigma):
    """(cdf, pmf) of the discrete Gaussian N_Z(0, sigma^2) on the integers."""
    k = np.arange(-int(12 * sigma) - 12, int(12 * sigma) + 13)
    w = np.exp(-(k.astype(float) ** 2) / (2 * sigma**2))
    pmf = w / w.sum()
    cdf = np.cumsum(pmf)

    def at(table, x, below):
        i = np.asarray(x, dtype=float) - k[0]
        inside = (i >= 0) & (i < len(k))
        out = np.where(i >= len(k), 1.0 if below == "cdf" else 0.0, 0.0)
        return np.where(inside, table[np.clip(i, 0, len(k) - 1).astype(int)], out)
    return (lambda x: at(cdf, x, "cdf")), (lambda x: at(pmf, x, "pmf"))


def reference(result, integer):
    """The cdf to test draws against. Integer noise X is tested as X + U, U ~ U[0, 1)
    independent (the draws are jittered in ``ks_pvalue``): continuous, with cdf
    F(y) = P(X <= floor(y) - 1) + frac(y) P(X = floor(y)), so the KS test stays exact."""
    b = result["noise_scale"]
    if not integer:
        return stats.laplace(scale=b).cdf if result["mechanism"] == "laplace" else stats.norm(scale=b).cdf
    if result["mechanism"] == "laplace":
        dist = stats.dlaplace(1 / b)
        cdf, pmf = dist.cdf, dist.pmf
    else:
        cdf, pmf = discrete_gaussian(b)

    def jittered(y):
        f = np.floor(y)
        return cdf(f - 1) + (y - f) * pmf(f)
    return jittered


def variance(result, integer):
    b = result["noise_scale"]
    if result["mechanism"] == "laplace":
        if integer:
            r = math.exp(-1 / b)
            return 2 * r / (1 - r) ** 2
        return 2 * b * b
    if integer:
        k = np.arange(-int(12 * b) - 12, int(12 * b) + 13).astype(float)
        w = np.exp(-k**2 / (2 * b * b))
        return float((k**2 * w).sum() / w.sum())
    return b * b


def ks_pvalue(draws, result, integer):
    x = np.asarray(draws, dtype=float)
    if integer:
        x = x + np.random.default_rng().random(len(x))
    return stats.kstest(x, reference(result, integer)).pvalue


CASES = [
    ("count", {"epsilon": 0.7}, True),
    ("count", {"rho": 0.05, "mechanism": "gaussian"}, True),
    ("sum", {"column": "x", "epsilon": 2.0}, False),
    ("sum", {"column": "x", "rho": 0.5, "mechanism": "gaussian"}, False),
]


@pytest.mark.parametrize("kind, params, integer", CASES)
def test_noise_has_the_declared_distribution_and_scale(kind, params, integer):
    values, result, plan = draws(kind, params)
    comp = plan.details["components"][kind]
    sens = 1 if kind == "count" else 10  # max(|-5|, |10|)
    assert comp["sensitivity"] == sens
    if "epsilon" in params:  # declared scale is what the budget implies
        assert result["noise_scale"] == pytest.approx(sens / params["epsilon"], rel=1e-9)
    else:
        assert result["noise_scale"] == pytest.approx(sens / math.sqrt(2 * params["rho"]), rel=1e-9)
    noise_draws = values - TRUE[kind]
    if integer:
        assert np.all(noise_draws == np.round(noise_draws))
    assert ks_pvalue(noise_draws, result, integer) > P_FAIL


@pytest.mark.parametrize("kind, params, integer", CASES)
def test_vector_noise_is_independent_per_group_with_the_declared_scale(kind, params, integer):
    noise_draws, result = grouped_draws(kind, params)
    assert ks_pvalue(noise_draws, result, integer) > P_FAIL
    var = variance(result, integer)
    # the sample variance of 2000 draws: within 35% for Laplace (kurtosis 6), 25% for Gaussian (7 sd)
    assert abs(noise_draws.var() / var - 1) < (0.35 if result["mechanism"] == "laplace" else 0.25)
    # neighbouring groups are uncorrelated
    assert abs(np.corrcoef(noise_draws[:-1], noise_draws[1:])[0, 1]) < 0.12


@pytest.mark.parametrize("kind, params, integer", CASES)
def test_ci95_covers_the_truth_95_percent_of_the_time(kind, params, integer):
    req = EngineRequest(kind, params)
    plan = plugins.plan("aggregates", req, DS)
    hits = 0
    for _ in range(DRAWS):
        lo, hi = plugins.run("aggregates", req, DS, TABLE, plan, lambda p: None).result["ci95"]
        hits += lo <= TRUE[kind] <= hi
    cover = hits / DRAWS
    # binomial sd at 0.95 is 0.0049; discrete intervals are conservative (>= 95%)
    assert 0.925 < cover < (0.976 if not integer else 1.0)


def test_mean_interval_from_simulation_covers_the_truth():
    req = EngineRequest("mean", {"column": "x", "epsilon": 3.0})
    plan = plugins.plan("aggregates", req, DS)
    truth = TRUE["sum"] / 7  # the null is excluded
    hits = sum(lo <= truth <= hi for lo, hi in (
        plugins.run("aggregates", req, DS, TABLE, plan, lambda p: None).result["ci95"] for _ in range(300)))
    # a bootstrap interval is approximate (measured: 0.946 over 1000 runs); 0.88 is 5.5 sd below 0.95
    assert hits / 300 > 0.88


def test_vectorised_quantile_scores_equal_openDPs_score_function():
    import opendp.prelude as dp

    rng = np.random.default_rng(0)
    for q in (0.5, 0.3, 0.9, 0.123):
        num, den = noise.quantile_alpha(q)
        for _ in range(5):
            x = np.round(rng.normal(50, 20, 300)).clip(0, 100)  # ties with candidates on purpose
            cands = np.linspace(0, 100, 51)
            ours = compute.quantile_scores(x, cands, num, den)[0]
            t = dp.t.make_quantile_score_candidates(dp.vector_domain(dp.atom_domain(T=float, nan=False)),
                                                     dp.symmetric_distance(), candidates=cands.tolist(), alpha=q)
            assert ours.tolist() == t(x.tolist())


def test_quantile_selection_concentrates_as_epsilon_grows():
    frame = pd.DataFrame({"x": np.linspace(0, 10, 1001)})
    ds = DatasetMeta("q", {"x": {"type": "numeric", "lower": 0, "upper": 10}}, None, 1001, 1001, 1e-6)
    table = pa.Table.from_pandas(frame, preserve_index=False)

    def picks(eps, n=150):
        req = EngineRequest("quantile", {"column": "x", "q": 0.5, "epsilon": eps, "candidates": 101})
        plan = plugins.plan("aggregates", req, ds)
        return np.array([plugins.run("aggregates", req, ds, table, plan, lambda p: None).result["value"]
                         for _ in range(n)])

    sharp, blunt = picks(5.0), picks(0.0005)
    assert np.abs(sharp - 5).max() <= 0.5  # rank error95 = 2/5 * ln(20 * 101) = 3 rows -> 0.03
    assert np.abs(blunt - 5).mean() > 1.5  # near uniform over [0, 10]: mean |error| 2.5


@pytest.mark.parametrize("kind, params, integer", CASES)
def test_the_ks_check_has_power(kind, params, integer):
    noise_draws, result = grouped_draws(kind, params)
    for factor in (0.5, 2.0):
        wrong = {**result, "noise_scale": result["noise_scale"] * factor}
        assert ks_pvalue(noise_draws, wrong, integer) < 1e-6
