"""One DP-SGD step's gradient in one backward pass: per-unit norms and the clipped sum by
book-keeping (Bu, Wang, Zha, Karypis 2023), for MLPs of Linear, LayerNorm and GroupNorm.

For a linear layer y = x W^T + b, the gradient of sample i's loss is g_i x_i^T (weight)
and g_i (bias), where x_i is the layer's input and g_i = dL_i/dy_i its output gradient.
So one ordinary backward pass, which records x and g at each layer instead of forming
the weight gradient, gives everything:

- the per-sample norm: ||g_i x_i^T||_F^2 = ||g_i||^2 ||x_i||^2 (no per-sample gradient
  is ever materialised);
- the clipped sum: sum_i c_i g_i x_i^T = (c * G)^T X, one matrix product, the same one
  the non-private backward pass spends on the weight gradient.

LayerNorm and GroupNorm on 2-D inputs end in an elementwise affine map y = xhat * w + b,
whose per-sample gradients are g_i * xhat_i and g_i.

**Privacy units** (group-level privacy): a unit's gradient is the sum of its rows'
gradients, and it is the unit's gradient that is clipped. For a linear layer the unit's
squared norm is sum_{i,j in u} (x_i . x_j)(g_i . g_j) (the "ghost norm" over the unit's
rows, computed on a [units, k, k] batch of Gram matrices); the clipped sum is again one
matrix product with each row weighted by its unit's factor.

The autograd functions below return no gradient for the parameters (autograd would
otherwise form the unclipped weight gradient too); ``clipped_sum`` writes the clipped
sums into ``p.grad``. ``tests/engines/test_dpsgd_clipping.py`` checks them against a
brute-force loop over units.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F


class Tape:
    """What the forward and backward passes record: per parametrised layer, its input
    (or normalised input) and its output gradient."""

    def __init__(self):
        self.layers: list[tuple[str, nn.Module, torch.Tensor]] = []  # (kind, module, input)
        self.grads: dict[int, torch.Tensor] = {}

    def add(self, kind: str, module: nn.Module, x: torch.Tensor) -> int:
        self.layers.append((kind, module, x))
        return len(self.layers) - 1


# The graph's nodes hold the tape by a weak reference: the tape holds the layers' inputs,
# whose grad_fn are the graph's nodes, and autograd nodes are outside Python's cycle
# collector. A strong reference made a cycle that was never freed: every step's inputs and
# graph stayed in memory (0.6 MB a step, 2.9 GB after 3,860 steps of a small MLP; a worker
# that trained a few models held 10 GB).
class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, tape, slot):
        ctx.save_for_backward(weight)
        ctx.tape, ctx.slot = weakref.ref(tape), slot
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, g):
        (weight,) = ctx.saved_tensors
        ctx.tape().grads[ctx.slot] = g
        gx = g @ weight if ctx.needs_input_grad[0] else None
        return gx, None, None, None, None


class _Affine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, xhat, weight, bias, tape, slot):
        ctx.save_for_backward(weight)
        ctx.tape, ctx.slot = weakref.ref(tape), slot
        return torch.addcmul(bias, xhat, weight)

    @staticmethod
    def backward(ctx, g):
        (weight,) = ctx.saved_tensors
        ctx.tape().grads[ctx.slot] = g
        return (g * weight if ctx.needs_input_grad[0] else None), None, None, None, None


def forward(model: nn.Sequential, x: torch.Tensor, tape: Tape) -> torch.Tensor:
    """``model(x)`` with every parametrised layer recorded on ``tape``."""
    for m in model:
        if isinstance(m, nn.Linear):
            slot = tape.add("linear", m, x)
            x = _Linear.apply(x, m.weight, m.bias, tape, slot)
        elif isinstance(m, (nn.LayerNorm, nn.GroupNorm)):
            if isinstance(m, nn.LayerNorm):
                xhat = F.layer_norm(x, m.normalized_shape, None, None, m.eps)
                affine = m.elementwise_affine
            else:
                xhat = F.group_norm(x, m.num_groups, None, None, m.eps)
                affine = m.affine
            if affine:
                slot = tape.add("affine", m, xhat)
                x = _Affine.apply(xhat, m.weight, m.bias, tape, slot)
            else:
                x = xhat
        elif any(True for _ in m.parameters(recurse=False)):
            raise TypeError(f"{type(m).__name__} is not supported by the book-keeping clipper")
        else:
            x = m(x)
    return x


def _unit_sq_norms_linear(x, g, pad, n_units):
    """Squared Frobenius norms of each unit's weight and bias gradients (rows grouped)."""
    zx = torch.cat([x, x.new_zeros(1, x.shape[1])])  # index -1 -> a zero row
    zg = torch.cat([g, g.new_zeros(1, g.shape[1])])
    xp, gp = zx[pad], zg[pad]  # [U, k, d]
    w = (torch.bmm(xp, xp.transpose(1, 2)) * torch.bmm(gp, gp.transpose(1, 2))).sum((1, 2))
    b = gp.sum(1).pow(2).sum(1)
    return w + b


@torch.no_grad()  # the recorded inputs of inner layers require grad: keep norms and .grad off the graph
def clipped_sum(tape: Tape, max_norm: float, units: torch.Tensor | None = None, pad: torch.Tensor | None = None,
                n_units: int | None = None) -> torch.Tensor:
    """Write sum over units of clip(unit gradient, max_norm) into each parameter's ``.grad``.

    Without ``units`` every row is its own unit. With them, ``units[i]`` is row i's unit
    (0..n_units-1) and ``pad`` the [n_units, k] row indices of each unit (-1 = none).
    Returns the units' gradient norms before clipping.
    """
    grouped = units is not None
    n = n_units if grouped else next(iter(tape.grads.values())).shape[0]
    sq = None
    for slot, (kind, m, x) in enumerate(tape.layers):
        g = tape.grads.get(slot)
        if g is None:  # pragma: no cover - every recorded layer lies on the path to the loss
            raise RuntimeError("a recorded layer got no gradient")
        if kind == "linear":
            if grouped:
                s = _unit_sq_norms_linear(x, g, pad, n)
            else:
                g2 = g.pow(2).sum(1)
                s = g2 * x.pow(2).sum(1) + (g2 if m.bias is not None else 0)
        else:
            gw = g * x
            if grouped:
                gw = torch.zeros(n, g.shape[1], dtype=g.dtype, device=g.device).index_add_(0, units, gw)
                gb = torch.zeros(n, g.shape[1], dtype=g.dtype, device=g.device).index_add_(0, units, g)
                s = gw.pow(2).sum(1) + gb.pow(2).sum(1)
            else:
                s = gw.pow(2).sum(1) + g.pow(2).sum(1)
        sq = s if sq is None else sq + s
    norms = sq.sqrt()
    factor = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    row_factor = factor[units] if grouped else factor
    for slot, (kind, m, x) in enumerate(tape.layers):
        g = tape.grads[slot] * row_factor[:, None]
        if kind == "linear":
            m.weight.grad = g.t() @ x
            if m.bias is not None:
                m.bias.grad = g.sum(0)
        else:
            m.weight.grad = (g * x).sum(0)
            m.bias.grad = g.sum(0)
    return norms
