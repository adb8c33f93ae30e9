"""The model every site trains: multinomial logistic regression (softmax) in numpy on the
features encoded from the declared schema only (``engines.dpsgd.features``). Small on
purpose: a site's ClientApp process starts per round and needs no torch.

Weights: ``[W (inputs x classes), b (classes)]``; a binary task has two classes.
"""

from __future__ import annotations

import numpy as np


def n_inputs(features: list[dict]) -> int:
    return sum(1 if f["type"] == "numeric" else len(f["domain"]) for f in features)


def init(features: list[dict], classes: int) -> list[np.ndarray]:
    return [np.zeros((n_inputs(features), classes), dtype=np.float64), np.zeros(classes, dtype=np.float64)]


def shapes(features: list[dict], classes: int) -> list[tuple]:
    return [tuple(a.shape) for a in init(features, classes)]


def logits(w: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    return x @ w[0] + w[1]


def predict(w: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    return np.argmax(logits(w, x), axis=1)


def local_train(w: list[np.ndarray], x: np.ndarray, y: np.ndarray, *, epochs: int, lr: float, batch: int,
                rng: np.random.Generator) -> list[np.ndarray]:
    """Mini-batch SGD on the cross-entropy from ``w``; returns the new weights."""
    W, b = w[0].copy(), w[1].copy()
    n = len(x)
    for _ in range(epochs):
        order = rng.permutation(n)
        for i in range(0, n, batch):
            idx = order[i:i + batch]
            xb, yb = x[idx], y[idx]
            z = xb @ W + b
            z -= z.max(axis=1, keepdims=True)
            p = np.exp(z)
            p /= p.sum(axis=1, keepdims=True)
            p[np.arange(len(idx)), yb] -= 1.0
            W -= lr * (xb.T @ p) / len(idx)
            b -= lr * p.mean(axis=0)
    return [W, b]


def dp_sgd(w: list[np.ndarray], x: np.ndarray, y: np.ndarray, *, steps: int, q: float, z: float, clip: float,
           expected: float, lr: float) -> list[np.ndarray]:
    """Local DP-SGD (sample-level DP at the site): ``steps`` steps, each on a Poisson sample
    of the rows at rate ``q``, every row's gradient (closed form for softmax regression:
    x (p - e_y) and p - e_y) clipped to L2 norm ``clip``, Gaussian noise of std ``z clip``
    on the sum (Opacus's secure-mode sampler), divided by ``expected`` (q n, public)."""
    import os

    import torch
    from opacus.optimizers.optimizer import _generate_noise

    gen = torch.Generator()
    gen.manual_seed(int.from_bytes(os.urandom(8), "little"))
    rng = np.random.default_rng(int.from_bytes(os.urandom(16), "little"))
    W, b = w[0].copy(), w[1].copy()
    for _ in range(steps):
        idx = np.nonzero(rng.random(len(x)) < q)[0]
        gW, gb = np.zeros_like(W), np.zeros_like(b)
        if len(idx):
            xb = x[idx]
            zl = xb @ W + b
            zl -= zl.max(axis=1, keepdims=True)
            p = np.exp(zl)
            p /= p.sum(axis=1, keepdims=True)
            p[np.arange(len(idx)), y[idx]] -= 1.0
            # per-row norm of [x_i (p_i - e_y)^T, p_i - e_y]: |x_i| |d_i| and |d_i|
            dn = np.linalg.norm(p, axis=1)
            norms = dn * np.sqrt(np.sum(xb * xb, axis=1) + 1.0)
            scale = np.minimum(1.0, clip / np.maximum(norms, 1e-12))
            ps = p * scale[:, None]
            gW, gb = xb.T @ ps, ps.sum(axis=0)
        noise = [_generate_noise(z * clip, torch.zeros(a.shape, dtype=torch.float64), generator=gen,
                                 secure_mode=True).numpy() for a in (gW, gb)]
        W -= lr * (gW + noise[0]) / expected
        b -= lr * (gb + noise[1]) / expected
    return [W, b]
