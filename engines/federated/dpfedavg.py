"""DP-FedAvg with central client-level DP (McMahan et al. 2018, "Learning differentially
private recurrent language models"), as the ServerApp runs it. Pure numpy except the noise.

Each round: every registered site is sampled independently with probability q (Poisson;
``sample_sites``); a sampled site trains locally from the global weights and sends its
update (local weights minus global), clipped at the site to L2 norm C (``clip``). The
server checks each update again (``check_update``): an update that is not finite or whose
norm exceeds C (beyond float rounding) is rejected -- never clipped, never averaged raw --
and the site is reported. The accepted updates are summed; Gaussian noise of standard
deviation z C is added to the sum (``noisy_mean``: Opacus's secure-mode sampler, as
``engines/dpsgd/train.py``), and the sum is divided by the *expected* number of sampled
sites q N (a public constant: dividing by the number that replied would depend on the
data). One site changes the sum by at most C whatever it sends (an update it withholds,
a rejected one and a dropped one all count 0), so each round is the Poisson-subsampled
Gaussian mechanism at rate q and noise multiplier z over sites: ``rounds`` rounds are the
event ``subsampled_gaussian(q, z, rounds)`` at the level of a whole site, which implies
the same guarantee for every row and every privacy unit held by one site.
"""

from __future__ import annotations

import math
import os

import numpy as np

NORM_SLACK = 1e-6  # relative: float32 rounding of an update clipped to exactly C


def clip(update: list[np.ndarray], c: float) -> tuple[list[np.ndarray], float]:
    """The update scaled to L2 norm at most ``c`` (the whole update: all arrays together)
    and its norm before clipping. Not finite: every array zero."""
    norm = global_norm(update)
    if not math.isfinite(norm):
        return [np.zeros_like(a) for a in update], norm
    scale = min(1.0, c / norm) if norm > 0 else 1.0
    return [(a * scale).astype(a.dtype) for a in update], norm


def global_norm(arrays: list[np.ndarray]) -> float:
    total = 0.0
    for a in arrays:
        a = np.asarray(a, dtype=np.float64)
        if not np.all(np.isfinite(a)):
            return math.inf if not np.any(np.isnan(a)) else math.nan
        total += float(np.sum(a * a))
    return math.sqrt(total)


def check_update(update: list[np.ndarray], shapes: list[tuple], c: float) -> str | None:
    """Why the server refuses this update (None: accepted): wrong shapes, a NaN or an
    infinity, or a norm above ``c``."""
    if len(update) != len(shapes) or any(tuple(a.shape) != tuple(s) for a, s in zip(update, shapes)):
        return "shape"
    norm = global_norm(update)
    if math.isnan(norm) or math.isinf(norm):
        return "not_finite"
    if norm > c * (1 + NORM_SLACK):
        # not the norm itself: an unclipped update's exact norm is a figure of the site's
        # rows with no noise, and it reached the analyst's result (a probe; secure
        # aggregation's sites say "norm over the clip")
        return f"norm over the clip (C {c:g})"
    return None


def sample_sites(sites: list[str], q: float, rng: np.random.Generator | None = None) -> list[str]:
    """Each site independently with probability ``q`` (Poisson sampling; a secure seed)."""
    rng = rng or np.random.default_rng(int.from_bytes(os.urandom(16), "little"))
    if q >= 1.0:
        return list(sites)
    return [s for s, u in zip(sites, rng.random(len(sites))) if u < q]


def noisy_mean(total: list[np.ndarray], std: float, expected: float, gen=None) -> list[np.ndarray]:
    """(sum + N(0, std^2) per coordinate) / expected, the noise from Opacus's secure-mode
    sampler on a ``torch.Generator`` seeded from ``os.urandom``; ``std`` 0: no noise (a
    non-private baseline)."""
    if std <= 0:
        return [a / expected for a in total]
    import torch
    from opacus.optimizers.optimizer import _generate_noise

    if gen is None:
        gen = torch.Generator()
        gen.manual_seed(int.from_bytes(os.urandom(8), "little"))
    out = []
    for a in total:
        t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))
        noise = _generate_noise(std, t, generator=gen, secure_mode=True)
        out.append(((t + noise) / expected).numpy())
    return out
