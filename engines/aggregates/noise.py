"""The only place that draws released noise: OpenDP measurements (contrib).

Every released number goes through an OpenDP sampler, never ``numpy.random``:

- counts (integers) use OpenDP's discrete samplers (``T = i64``): the discrete Laplace
  (geometric) and the discrete Gaussian of Canonne, Kamath and Steinke (2020), exact
  integer arithmetic, no floating-point attack surface;
- sums (floats) use OpenDP's float measurements, which sample the discrete
  distribution on a fine grid of multiples of 2^k and round the input to it: the
  floating-point-safe construction that answers Mironov (2012);
- quantiles use OpenDP's ``make_noisy_max`` under ``MaxDivergence`` on OpenDP's integer
  quantile scores (``make_quantile_score_candidates``): report-noisy-max with exponential
  noise, i.e. permute-and-flip (McKenna & Sheldon 2020), the pure-DP selection OpenDP's
  own quantile helper (``make_private_quantile``) uses. It is an exponential-mechanism
  variant with the same epsilon and an error never worse than the Gumbel form
  (OpenDP 0.16 deprecates ``make_report_noisy_max_gumbel`` in its favour).

The privacy charge of a plan is always OpenDP's own privacy map of the measurement the
run builds (``Measurement.map(d_in)``), so the ledger is charged exactly what OpenDP
proves, never a number derived by hand. Scales are calibrated so that the map is at most
the requested cost (OpenDP's maps round up; a scale is nudged up until they fit).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from engines import opendp_names as dp

dp.enable_features("contrib")

INT = "i64"
UINT = "u64"
ALPHA = 0.05  # 95% intervals
Z95 = float(dp.gaussian_scale_to_accuracy(1.0, ALPHA))  # 1.95996...

__all__ = ["Noise", "calibrate", "for_accuracy", "quantile_chain_cost", "quantile_alpha", "noisy_argmin",
           "OpenDPError"]

OpenDPError = dp.OpenDPException


@dataclass(frozen=True)
class Noise:
    """One additive-noise measurement: ``mechanism`` (laplace: pure epsilon, gaussian: zCDP
    rho), noise ``scale`` (Laplace b, or Gaussian sigma), the query's ``sensitivity``
    (L1 for Laplace, L2 for Gaussian), integer (discrete samplers) or float, and whether
    it releases a vector (one entry per group/bin)."""

    mechanism: str
    scale: float
    sensitivity: float
    integer: bool
    vector: bool

    def measurement(self):
        """OpenDP's measurement (``_measurement``: built once per noise, then reused)."""
        return _measurement(self.mechanism, float(self.scale), self.integer, self.vector)

    @property
    def d_in(self):
        return int(self.sensitivity) if self.integer else float(self.sensitivity)

    def cost(self) -> float:
        """OpenDP's privacy map at the query's sensitivity: epsilon (laplace) or rho (gaussian)."""
        return _cost(self)

    def release(self, exact):
        """The exact value (a number, or a list for a vector) plus OpenDP noise."""
        if self.vector:
            arg = [int(v) for v in exact] if self.integer else [float(v) for v in exact]
        else:
            arg = int(exact) if self.integer else float(exact)
        return self.measurement()(arg)

    def halfwidth(self, alpha: float = ALPHA) -> float:
        """Half-width h of the 95% interval value +- h: P(|noise| > h) <= 0.05 (``alpha``).

        Float noise: Laplace b ln(20), Gaussian 1.96 sigma (OpenDP's accuracy helpers).
        Integer noise: OpenDP's discrete helpers give the smallest a with
        P(|noise| >= a) <= 0.05; since the noise is an integer, ceil(a) - 1 is the
        half-width (slightly wider than b ln 20 for the discrete Laplace). Beyond
        sigma = 1e4, where OpenDP's exact discrete-Gaussian sum gets slow,
        floor(1.96 sigma + 1) bounds it (the discrete tail past t is at most the
        continuous tail past t - 1).
        """
        b = float(self.scale)
        if not self.integer:
            if self.mechanism == "laplace":
                return float(dp.laplacian_scale_to_accuracy(b, alpha))
            return float(dp.gaussian_scale_to_accuracy(b, alpha))
        if self.mechanism == "laplace":
            a = dp.discrete_laplacian_scale_to_accuracy(b, alpha)
        elif b <= 1e4:
            a = dp.discrete_gaussian_scale_to_accuracy(b, alpha)
        else:
            z = Z95 if alpha == ALPHA else float(dp.gaussian_scale_to_accuracy(1.0, alpha))
            return float(math.floor(z * b + 1.0))
        if not math.isfinite(a):
            if b >= 1.0:  # pragma: no cover - OpenDP only gives up at tiny scales
                raise ValueError(f"no accuracy for noise scale {b}")
            a = 1.0  # tiny scale (OpenDP returns -inf): P(|noise| >= 1) is ~2 exp(-1/b) ~ 0
        return float(max(math.ceil(a) - 1, 0))

    def to_dict(self) -> dict:
        return {"mechanism": self.mechanism, "scale": self.scale, "sensitivity": self.sensitivity,
                "integer": self.integer, "vector": self.vector}

    @classmethod
    def from_dict(cls, d: dict) -> "Noise":
        return cls(d["mechanism"], float(d["scale"]), d["sensitivity"], bool(d["integer"]), bool(d["vector"]))


@functools.cache
def _space(mechanism: str, integer: bool, vector: bool):
    """The (domain, metric) a measurement is built on; OpenDP's objects are immutable, so
    one of each serves every plan and release (built per call, they were a third of the
    request POST's noise calibration)."""
    T = INT if integer else float
    atom = dp.atom_domain(T=INT) if integer else dp.atom_domain(T=float, nan=False)
    if vector:
        return dp.vector_domain(atom), dp.l2_distance(T=T) if mechanism == "gaussian" else dp.l1_distance(T=T)
    return atom, dp.absolute_distance(T=T)


@functools.lru_cache(maxsize=4096)
def _measurement(mechanism: str, scale: float, integer: bool, vector: bool):
    """A measurement is immutable and draws fresh noise from OpenDP's own generator on each
    call, so one object serves every plan and release of the same noise: the planner asks
    for the same few (the calibration's scales) on every POST, the worker for the plan's
    at its cost check and its release."""
    domain, metric = _space(mechanism, integer, vector)
    if mechanism == "laplace":
        return dp.m.make_laplace(domain, metric, scale=scale)
    if mechanism == "gaussian":
        return dp.m.make_gaussian(domain, metric, scale=scale)
    raise ValueError(f"unknown mechanism {mechanism!r}")


@functools.lru_cache(maxsize=4096)
def _cost(noise: Noise) -> float:
    """``Noise.cost``: the map is a pure function of the noise (~0.06 ms per call through
    OpenDP), asked on every POST's calibration and every release's cost check."""
    return float(noise.measurement().map(noise.d_in))


def _fit(make, scale: float, target: float) -> tuple[float, float]:
    """Nudge ``scale`` up until OpenDP's map of ``make(scale)`` is at most ``target``."""
    for i in range(80):
        cost = make(scale)
        if cost <= target:
            return scale, cost
        scale *= 1.0 + 2.0 ** (-52 + i)
    raise ValueError("could not calibrate the noise scale to the requested budget")


def _positive_budget(target: float) -> None:
    if not (math.isfinite(target) and target > 0):  # e.g. 5e-324 split over three components is 0
        raise ValueError(f"the budget per measurement ({target!r}) is not a positive number")


def calibrate(mechanism: str, sensitivity, target: float, *, integer: bool, vector: bool) -> tuple[Noise, float]:
    """The smallest (up to float nudging) noise whose OpenDP map at ``sensitivity`` is at
    most ``target`` (epsilon for laplace, rho for gaussian). Returns (noise, its cost)."""
    _positive_budget(target)
    if mechanism == "laplace":
        scale = sensitivity / target
    else:  # zCDP: rho = sensitivity^2 / (2 sigma^2)
        scale = sensitivity / math.sqrt(2.0 * target)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"the noise scale would be {scale!r} (sensitivity {sensitivity!r} at a budget of {target!r} "
                         "per measurement): bounds this narrow or a budget this small or large cannot be calibrated")

    def make(s):
        return Noise(mechanism, s, sensitivity, integer, vector).cost()

    scale, cost = _fit(make, scale, target)
    return Noise(mechanism, scale, sensitivity, integer, vector), cost


def for_accuracy(mechanism: str, sensitivity, halfwidth: float, *, integer: bool, vector: bool) -> tuple[Noise, float]:
    """The noise whose 95% interval (``Noise.halfwidth``) is at most ``halfwidth``, from
    OpenDP's accuracy helpers, and its cost (OpenDP's map at ``sensitivity``)."""
    h = float(halfwidth)
    if not integer:
        scale = (dp.accuracy_to_laplacian_scale(h, ALPHA) if mechanism == "laplace"
                 else dp.accuracy_to_gaussian_scale(h, ALPHA))
    else:
        # Integer noise: P(|X| > h) = P(|X| >= floor(h) + 1); the helpers solve P(|X| >= a) = alpha
        # exactly, so shrink the scale a hair to stay strictly inside.
        a = math.floor(h) + 1
        if mechanism == "laplace":
            scale = dp.accuracy_to_discrete_laplacian_scale(float(a), ALPHA)
        elif a <= 2000:
            scale = dp.accuracy_to_discrete_gaussian_scale(float(a), ALPHA)
        else:  # Noise.halfwidth's bound for large sigma: floor(1.96 sigma + 1) <= floor(h)
            scale = (a - 2) / Z95
        scale *= 1 - 1e-9
    noise = Noise(mechanism, float(scale), sensitivity, integer, vector)
    return noise, noise.cost()


# --------------------------------------------------------------------------- quantiles


def _score_transformation(candidates: list[float], q: float):
    return dp.t.make_quantile_score_candidates(
        dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.symmetric_distance(),
        candidates=[float(c) for c in candidates], alpha=float(q))


def _noisy_min(scale: float):
    return dp.m.make_noisy_max(dp.vector_domain(dp.atom_domain(T=UINT)), dp.linf_distance(T=UINT),
                               dp.max_divergence(), scale=float(scale), negate=True)


def noisy_max(scale: float, *, zcdp: bool = False):
    """OpenDP's report-noisy-max over float scores (the synthesis engines' selections): its
    map gives epsilon (max divergence), or rho with ``zcdp`` (zero-concentrated divergence)."""
    measure = dp.zero_concentrated_divergence() if zcdp else dp.max_divergence()
    return dp.m.make_noisy_max(dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.linf_distance(T=float),
                               measure, scale=float(scale))


def quantile_alpha(q: float) -> tuple[int, int]:
    """OpenDP's integer representation (alpha_num, alpha_den) of ``q``, read off its own
    score function on two one-row datasets (a row below every candidate scores
    den - num, a row above scores num), so the vectorised scores in compute.py equal
    OpenDP's exactly."""
    t = _score_transformation([0.0, 1.0], q)
    below, above = t([-1.0])[0], t([2.0])[0]
    return int(above), int(below) + int(above)


def quantile_chain_cost(candidates: list[float], q: float, k: int, epsilon: float) -> tuple[float, int, float]:
    """Calibrate OpenDP's quantile chain ``make_quantile_score_candidates >> noisy min``
    (report-noisy-max, exponential noise) to ``epsilon`` at ``k`` rows per unit
    (symmetric distance k). Returns (noise scale, score sensitivity, epsilon from the
    chain's map)."""
    _positive_budget(epsilon)
    t = _score_transformation(candidates, q)
    score_sensitivity = int(t.map(int(k)))
    # Report-noisy-max on non-monotonic scores: epsilon = 2 * d_score / scale.
    scale, _ = _fit(lambda s: float(_noisy_min(s).map(score_sensitivity)), 2.0 * score_sensitivity / epsilon,
                    epsilon)
    chain = t >> dp.m.then_noisy_max(dp.max_divergence(), scale=float(scale), negate=True)
    cost = float(chain.map(int(k)))
    if cost > epsilon * (1 + 1e-12):  # pragma: no cover - the chain's map is the composition of the two
        raise ValueError("quantile calibration failed")
    return float(scale), score_sensitivity, cost


def noisy_min_cost(scale: float, score_sensitivity: int) -> float:
    return float(_noisy_min(scale).map(int(score_sensitivity)))


def noisy_argmin(scores, scale: float) -> int:
    """Index of the (noisily) smallest score: OpenDP's report-noisy-max (exponential noise)."""
    return int(_noisy_min(scale)([int(s) for s in scores]))
