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
    k = W.shape[1]
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
