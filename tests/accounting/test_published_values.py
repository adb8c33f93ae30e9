"""The accountants against published values and independently computed references.

Each test states its source and its tolerance. References are recomputed here from first
principles (numerical integration, closed forms written out again) or taken from Opacus,
never from the code under test.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate
from scipy.stats import norm

from accounting import advanced, basic, rdp
from accounting import events as ev
from accounting.gaussian import gaussian_delta, gaussian_epsilon
from accounting.rdp_math import (
    FINITE_ORDERS,
    ORDERS,
    gaussian_curve,
    laplace_curve,
    pure_dp_curve,
)

opacus_rdp = pytest.importorskip("opacus.accountants.analysis.rdp")

# A finer grid than ours, as in Opacus's own examples: 1.1, 1.2, ..., 10.9, then 12..255.
FINE_ORDERS = [1 + x / 10 for x in range(1, 100)] + list(range(12, 256))


def opacus_epsilon(q, z, steps, delta, orders=FINE_ORDERS):
    """Opacus's epsilon for DP-SGD: its RDP of the subsampled Gaussian, its conversion."""
    curve = opacus_rdp.compute_rdp(q=q, noise_multiplier=z, steps=steps, orders=orders)
    eps, _ = opacus_rdp.get_privacy_spent(orders=orders, rdp=curve, delta=delta)
    return float(eps)


def ours(q, z, steps, delta):
    return rdp.compose([ev.SubsampledGaussianEvent(q, z, steps)], delta).epsilon


def order_index(alpha):
    return list(FINITE_ORDERS).index(alpha)


# ----------------------------------------------------------------------- DP-SGD / RDP

DPSGD_SETTINGS = [
    # Opacus MNIST tutorial-like settings: batch 256 of 60,000, z = 1.1, 60 epochs.
    pytest.param(256 / 60000, 1.1, int(60 / (256 / 60000)), 1e-5, id="opacus-mnist"),
    # Abadi et al. 2016 (CCS), Sec. 3.1: lot L = 0.01 N, sigma = 4, T = 10,000.
    pytest.param(0.01, 4.0, 10_000, 1e-5, id="abadi-sigma4"),
    # Abadi et al. 2016, Sec. 5 MNIST noise levels with q = 0.01: sigma = 2 for 100 epochs
    # (T = 10,000) and sigma = 8 for 100 epochs; and sigma = 2 for 10 epochs.
    pytest.param(0.01, 2.0, 10_000, 1e-5, id="abadi-sigma2-100ep"),
    pytest.param(0.01, 2.0, 1_000, 1e-5, id="abadi-sigma2-10ep"),
    pytest.param(0.01, 8.0, 10_000, 1e-5, id="abadi-sigma8-100ep"),
]


@pytest.mark.parametrize("q, z", [(0.01, 1.0), (0.001, 2.0), (0.004, 0.8), (0.02, 5.0), (1e-4, 0.6)])
def test_the_top_orders_match_dp_accounting_where_opacus_overflows(q, z):
    """Opacus gives NaN at orders 2048 and 4096 (its binomial coefficients overflow); the
    service sums the same series in log space and must agree with Google's dp_accounting,
    whose integer-order expansion is exact there. Before, it fell back to the unsubsampled
    Gaussian (2048 x 1/(2 z^2)), over-charging small DP-SGD runs."""
    dp_accounting = pytest.importorskip("dp_accounting")
    from accounting.rdp_math import _one_step_curve

    top = [1024.0, 2048.0, 4096.0]
    acc = dp_accounting.rdp.RdpAccountant(orders=top)
    acc.compose(dp_accounting.PoissonSampledDpEvent(
        sampling_probability=q, event=dp_accounting.GaussianDpEvent(noise_multiplier=z)))
    curve = _one_step_curve(q, z)
    got = [curve[order_index(a)] for a in top]
    assert got == pytest.approx(list(acc._rdp), rel=1e-9)
    assert all(g < a / (2 * z * z) for g, a in zip(got, top, strict=True))  # tighter than no subsampling


@pytest.mark.parametrize("q, z, steps, delta", [(1e-3, 20.0, 10, 1e-9), (1e-3, 50.0, 1, 1e-12),
                                                  (1e-3, 20.0, 100, 1e-12)])
def test_a_tiny_dpsgd_run_is_charged_what_dp_accounting_says(q, z, steps, delta):
    """Runs of tiny cost convert at the top orders: the charge is dp_accounting's epsilon
    on the same order grid (with the fallback it was 3.8 to 4.5 times higher)."""
    dp_accounting = pytest.importorskip("dp_accounting")

    acc = dp_accounting.rdp.RdpAccountant(orders=list(FINITE_ORDERS))
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        sampling_probability=q, event=dp_accounting.GaussianDpEvent(noise_multiplier=z)), steps))
    assert ours(q, z, steps, delta) == pytest.approx(acc.get_epsilon(delta), rel=1e-6)


@pytest.mark.parametrize("q, z, steps, delta", DPSGD_SETTINGS)
def test_it_matches_opacus_on_dpsgd_within_one_percent(q, z, steps, delta):
    # Tolerance: our grid is coarser than FINE_ORDERS (and also reaches below 1.1 and above
    # 255), so the minimising order differs slightly: |ours - opacus| <= 1% of opacus, and
    # never more than 2% looser than Opacus.
    ref = opacus_epsilon(q, z, steps, delta)
    got = ours(q, z, steps, delta)
    assert got == pytest.approx(ref, rel=0.01)
    assert got <= ref * 1.02


def test_it_is_below_the_moments_accountant_of_abadi_et_al():
    # Abadi et al. 2016, Sec. 3.1: "with L = 0.01N, sigma = 4, delta = 1e-5 and T = 10000,
    # we have eps ~ 1.26 using the moments accountant". RDP with the Balle et al. 2020
    # conversion is tighter, so ours must be at most 1.26 (and within 1% of Opacus).
    got = ours(0.01, 4.0, 10_000, 1e-5)
    assert got <= 1.26
    assert got == pytest.approx(opacus_epsilon(0.01, 4.0, 10_000, 1e-5), rel=0.01)


# tensorflow/privacy, tutorials/README.md, "Select Parameters" table (MNIST, N = 60,000,
# batch 256, delta = 1e-5): (noise multiplier, epochs) -> published epsilon. Those were
# computed with the older conversion eps = rho(a) + log(1/delta) / (a - 1) on the grid
# 1.1..10.9, 12..63 and steps = ceil(epochs N / batch).
TF_PRIVACY_TABLE = [(1.3, 15, 1.19), (1.1, 60, 3.01), (0.7, 45, 7.10)]
TF_ORDERS = [1 + x / 10 for x in range(1, 100)] + list(range(12, 64))


@pytest.mark.parametrize("z, epochs, published", TF_PRIVACY_TABLE)
def test_it_is_below_the_tf_privacy_mnist_table(z, epochs, published):
    q, steps = 256 / 60000, math.ceil(epochs * 60000 / 256)
    # First check that the reference is understood: Opacus's RDP curve with TF Privacy's
    # old conversion reproduces the published value to its two printed decimals.
    curve = np.asarray(opacus_rdp.compute_rdp(q=q, noise_multiplier=z, steps=steps, orders=TF_ORDERS))
    old = float(np.min(curve - math.log(1e-5) / (np.asarray(TF_ORDERS) - 1)))
    assert old == pytest.approx(published, abs=0.005 + 1e-9)
    # The Balle et al. 2020 conversion is never looser than the old one.
    assert ours(q, z, steps, 1e-5) <= published


# -------------------------------------------------------------------- analytic Gaussian

GAUSSIAN_CASES = [(0.5, 1e-5), (1.0, 1e-5), (2.0, 1e-6), (5.0, 1e-5), (10.0, 1e-10), (30.0, 1e-5)]


@pytest.mark.parametrize("z, delta", GAUSSIAN_CASES)
def test_analytic_gaussian_epsilon_is_valid_and_tight(z, delta):
    # Balle & Wang 2018, Thm. 8: (eps, delta)-DP iff gaussian_delta(z, eps) <= delta.
    eps = gaussian_epsilon(z, delta)
    assert 0 < eps < math.inf
    assert gaussian_delta(z, eps) <= delta
    # Tight: 0.1% less epsilon is not enough.
    assert gaussian_delta(z, eps * 0.999) > delta


def _delta_in_80_digits(z: float, eps: float):
    import mpmath

    with mpmath.workdps(80):
        zm, em = mpmath.mpf(z), mpmath.mpf(eps)
        return mpmath.ncdf(1 / (2 * zm) - em * zm) - mpmath.exp(em) * mpmath.ncdf(-1 / (2 * zm) - em * zm)


@settings(max_examples=150, deadline=None)
@given(log_z=st.floats(-2, 6), log_delta=st.floats(-300, -0.6))
def test_analytic_gaussian_epsilon_is_valid_in_80_digits_far_out_in_the_tails(log_z, log_delta):
    """Balle-Wang's inequality checked in 80 digits at the epsilon returned: with z = 1e6
    at delta = 1e-300 the float difference cancelled (a is 3.6e7 times delta) and scipy's
    tails carry 1e-11 to 1e-9 relative errors, so 46 of 400 random pairs got an epsilon
    up to 7e-9 short of valid (a probe's)."""
    z, delta = 10.0 ** log_z, 10.0 ** log_delta
    eps = gaussian_epsilon(z, delta)
    if 0 < eps < math.inf:
        assert _delta_in_80_digits(z, eps) <= delta


def test_analytic_gaussian_epsilon_of_nan_is_an_error_not_zero():
    for args in ((math.nan, 1e-5), (1.0, math.nan)):
        with pytest.raises(ValueError):
            gaussian_epsilon(*args)


@pytest.mark.parametrize("eps", [0.05, 0.1, 0.5, 0.9, 0.99])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-9])
def test_analytic_gaussian_is_never_looser_than_the_classical_bound(eps, delta):
    # Dwork & Roth 2014, Thm. A.1: for eps < 1, z = sqrt(2 ln(1.25/delta)) / eps gives
    # (eps, delta)-DP. The exact (analytic) epsilon can only be smaller.
    z = math.sqrt(2 * math.log(1.25 / delta)) / eps
    assert gaussian_epsilon(z, delta) <= eps


def hockey_stick_delta(z, eps):
    """delta(eps) = int max(0, p(x) - e^eps q(x)) dx for p = N(0, z^2), q = N(1, z^2).

    Direct numerical integration of the privacy-loss definition; no closed form used.
    p >= e^eps q exactly where x <= 1/2 - eps z^2, so integrate up to there.
    """
    x_star = 0.5 - eps * z * z
    p = norm(0, z).pdf
    q = norm(1, z).pdf
    val, _ = integrate.quad(lambda x: p(x) - math.exp(eps) * q(x), x_star - 40 * z, x_star,
                            epsabs=1e-14, epsrel=1e-10, limit=200)
    return val


@pytest.mark.parametrize("z, eps", [(1.0, 1.0), (2.0, 0.5), (0.8, 2.0), (4.0, 0.3)])
def test_analytic_gaussian_delta_matches_numerical_integration(z, eps):
    # Tolerance: rel 1e-6 (quad is asked for 1e-10).
    assert gaussian_delta(z, eps) == pytest.approx(hockey_stick_delta(z, eps), rel=1e-6)


def test_analytic_gaussian_known_pair():
    # Dong, Roth, Su 2019 (Gaussian DP), Cor. 2.13: mu-GDP with mu = 1/z has
    # delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2). For z = 1, eps = 1:
    # Phi(-0.5) - e Phi(-1.5) = 0.1269367 (to 7 places).
    assert norm.cdf(-0.5) - math.e * norm.cdf(-1.5) == pytest.approx(0.1269367, abs=5e-8)
    assert gaussian_delta(1.0, 1.0) == pytest.approx(0.1269367, abs=5e-8)
    assert gaussian_epsilon(1.0, 0.1269367) == pytest.approx(1.0, abs=1e-5)


# ------------------------------------------------------------------ advanced composition


def test_kov_is_below_drv_on_the_dwork_roth_example():
    # Dwork & Roth 2014, Thm. 3.20 (Dwork-Rothblum-Vadhan 2010): k releases of eps0 are
    # (sqrt(2k ln(1/delta')) eps0 + k eps0 (e^eps0 - 1), k delta + delta')-DP.
    k, eps0, dp = 100, 0.1, 1e-5
    drv = math.sqrt(2 * k * math.log(1 / dp)) * eps0 + k * eps0 * (math.exp(eps0) - 1)
    assert drv == pytest.approx(5.85, abs=0.005)
    # Kairouz-Oh-Viswanath 2015, Thm. 3.5 (heterogeneous form), written out again here:
    # min(k eps0, k eps0 tanh(eps0/2) + sqrt(2 k eps0^2 log(e + sqrt(k eps0^2)/delta')),
    #             k eps0 tanh(eps0/2) + sqrt(2 k eps0^2 log(1/delta'))).
    s, sq, th = k * eps0, k * eps0**2, k * eps0 * (math.exp(eps0) - 1) / (math.exp(eps0) + 1)
    kov_ref = min(s, th + math.sqrt(2 * sq * math.log(math.e + math.sqrt(sq) / dp)),
                  th + math.sqrt(2 * sq * math.log(1 / dp)))
    kov = advanced.kov_epsilon(s, sq, th, dp)
    assert kov == pytest.approx(kov_ref, rel=1e-12)
    assert kov <= drv
    assert kov <= k * eps0
    assert kov == pytest.approx(5.298, abs=0.001)
    # Through the accountant: 100 Laplace(0.1) at target delta 1e-5 (all of it is delta').
    got = advanced.compose([ev.SelfComposedEvent(ev.LaplaceEvent(eps0), k)], dp)
    assert got.epsilon == pytest.approx(kov_ref, rel=1e-12)
    assert got.delta == dp


# ------------------------------------------------------------------------- RDP curves


def renyi_divergence(logp, logq, alpha, breakpoints, lo, hi):
    """D_alpha(P || Q) = 1/(alpha-1) log int p^alpha q^(1-alpha), by quad over [lo, hi].

    The integrand is formed in log space so that q^(1-alpha) cannot overflow.
    """
    pieces = [lo, *breakpoints, hi]
    total = 0.0
    for a, b in zip(pieces, pieces[1:]):
        val, _ = integrate.quad(lambda x: math.exp(alpha * logp(x) + (1 - alpha) * logq(x)), a, b,
                                epsabs=0, epsrel=1e-12, limit=200)
        total += val
    return math.log(total) / (alpha - 1)


@pytest.mark.parametrize("eps", [0.1, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("alpha", [1.5, 2.0, 5.0, 10.0])
def test_laplace_curve_matches_numerical_integration(eps, alpha):
    # Mironov 2017, Prop. 6, checked against the definition: Laplace(scale 1/eps) at 0 vs
    # at 1 (sensitivity 1). Tolerance: rel 1e-6.
    b = 1 / eps

    def logp(x):
        return -abs(x) / b - math.log(2 * b)

    def logq(x):
        return -abs(x - 1) / b - math.log(2 * b)

    ref = renyi_divergence(logp, logq, alpha, [0.0, 1.0], lo=-80 * b, hi=80 * b)
    assert laplace_curve(eps)[order_index(alpha)] == pytest.approx(ref, rel=1e-6)
    assert laplace_curve(eps)[-1] == eps  # alpha = inf: the max divergence


@pytest.mark.parametrize("eps", [0.1, 0.5, 1.0, 3.0])
@pytest.mark.parametrize("alpha", [1.001, 1.5, 2.0, 5.0, 32.0])
def test_pure_dp_curve_is_randomised_response(eps, alpha):
    # Randomised response with P = (e^eps, 1)/(1 + e^eps), Q = (1, e^eps)/(1 + e^eps):
    # D_alpha = 1/(alpha-1) log sum P^alpha Q^(1-alpha), summed directly. Tolerance 1e-6.
    p = np.array([math.exp(eps), 1.0]) / (1 + math.exp(eps))
    q = p[::-1]
    ref = math.log(float(np.sum(p**alpha * q ** (1 - alpha)))) / (alpha - 1)
    assert pure_dp_curve(eps)[order_index(alpha)] == pytest.approx(ref, rel=1e-6)
    assert pure_dp_curve(eps)[-1] == eps


@pytest.mark.parametrize("z", [0.5, 1.0, 3.0])
def test_gaussian_curve_at_order_two(z):
    # Mironov 2017, Prop. 7: alpha / (2 z^2); at alpha = 2 that is 1 / z^2, also checked
    # by integrating the definition. Tolerance 1e-12 (closed form), 1e-6 (quad).
    got = gaussian_curve(z)[order_index(2.0)]
    assert got == pytest.approx(1 / z**2, rel=1e-12)
    ref = renyi_divergence(norm(0, z).logpdf, norm(1, z).logpdf, 2.0, [0.5], lo=-40 * z, hi=40 * z)
    assert got == pytest.approx(ref, rel=1e-6)
    assert gaussian_curve(z)[-1] == math.inf
    assert len(gaussian_curve(z)) == len(ORDERS)


# ------------------------------------------------------------------ basic composition


def test_ten_laplace_releases_of_a_tenth_compose_to_one_under_basic():
    # Dwork & Roth 2014, Thm. 3.16. "Exactly" up to float summation of ten 0.1s (1e-12).
    spent = basic.compose([ev.LaplaceEvent(0.1)] * 10, 1e-5)
    assert spent.epsilon == pytest.approx(1.0, rel=1e-12)
    assert spent.delta == 0.0
    assert basic.compose([ev.SelfComposedEvent(ev.LaplaceEvent(0.1), 10)], 1e-5).epsilon == 1.0


@pytest.mark.parametrize("eps", [0.01, 0.1, 1.0, 5.0])
@pytest.mark.parametrize("delta", [0.0, 1e-9, 1e-5])
def test_rdp_reports_a_single_laplace_at_its_basic_epsilon(eps, delta):
    # RDP never reports more than basic composition where basic is valid; one Laplace
    # release is exactly eps-DP and RDP cannot do better than that.
    events = [ev.LaplaceEvent(eps)]
    assert rdp.compose(events, delta).epsilon == pytest.approx(basic.compose(events, delta).epsilon,
                                                               rel=1e-12)
    assert rdp.compose(events, delta).epsilon == pytest.approx(eps, rel=1e-12)


@pytest.mark.parametrize("events", [
    [ev.LaplaceEvent(0.5), ev.LaplaceEvent(0.2)],
    [ev.GaussianEvent(3.0)],
    [ev.GaussianEvent(3.0), ev.LaplaceEvent(0.3), ev.EpsilonDeltaEvent(0.2, 1e-7)],
    [ev.SelfComposedEvent(ev.LaplaceEvent(0.05), 400)],
])
def test_rdp_never_exceeds_basic_where_basic_is_valid(events):
    for delta in (1e-6, 1e-5, 1e-3):
        b = basic.compose(events, delta)
        assert b.delta <= delta
        assert rdp.compose(events, delta).epsilon <= b.epsilon * (1 + 1e-12)
