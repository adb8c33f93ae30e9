"""Book-keeping clipping (engines/dpsgd/clipping.py) against references computed here.

The reference is the definition, written as a loop: for each privacy unit, a separate
forward and backward pass of the ordinary torch module on that unit's rows only gives
the unit's gradient; clip it to ``max_norm`` (factor min(1, C / ||g||)) and sum. Models
are random MLPs from the engine's own spec language (``expand_model`` + ``build``), in
float64. The per-sample norms are also compared with Opacus's ``GradSampleModule``.

Tolerances: float64 round-off (rtol 1e-7), plus the clipper's 1e-6 stabiliser in
C / (||g|| + 1e-6) (Opacus's convention), which moves a clipped unit's gradient by at
most 1e-6 in norm: atol 1e-6 per unit.
"""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engines.dpsgd import clipping, train
from engines.dpsgd.model_spec import build, expand_model
from tests.engines.dpsgd_helpers import one_thread  # noqa: F401  (autouse)

TASKS = ("binary", "multiclass", "regression")


def reference_loss(task, out, y):
    """Per-row losses, written out independently of train.row_losses."""
    if task == "binary":
        return F.binary_cross_entropy_with_logits(out[:, 0], y, reduction="none")
    if task == "multiclass":
        return -torch.log_softmax(out, 1).gather(1, y[:, None])[:, 0]
    return (out[:, 0] - y) ** 2


def make_targets(task, n, n_classes, gen):
    if task == "binary":
        return torch.randint(2, (n,), generator=gen).double()
    if task == "multiclass":
        return torch.randint(n_classes, (n,), generator=gen)
    return torch.rand(n, generator=gen, dtype=torch.float64)


# A random MLP: 1-3 hidden blocks of linear + optional norm (batchnorm is fixed to
# groupnorm by expand_model) + activation + optional dropout(p=0).
block = st.fixed_dictionaries({
    "out": st.integers(2, 6),
    "norm": st.sampled_from(["layernorm", "groupnorm", "batchnorm", None]),
    "act": st.sampled_from(["relu", "tanh", "gelu", "sigmoid", "elu", "leaky_relu", "silu"]),
    "dropout": st.booleans(),
})


def layers_of(blocks):
    out = []
    for b in blocks:
        out.append({"type": "linear", "out": b["out"]})
        if b["norm"]:
            out.append({"type": b["norm"]})
        out.append({"type": b["act"]})
        if b["dropout"]:
            out.append({"type": "dropout", "p": 0.0})
    return out


def make_model(blocks, n_in, n_out, seed):
    layers, _ = expand_model({"layers": layers_of(blocks)}, n_in, n_out, fix=True)
    torch.manual_seed(seed)
    model = build(layers).double()
    # Non-trivial norm affines (they start at 1 and 0).
    with torch.no_grad():
        for m in model:
            if isinstance(m, (nn.LayerNorm, nn.GroupNorm)):
                m.weight.normal_(1.0, 0.5)
                m.bias.normal_(0.0, 0.5)
    return model


def unit_grads(model, task, x, y, members):
    """Reference: each unit's gradient by its own forward/backward pass (flattened)."""
    out = []
    for rows in members:
        model.zero_grad(set_to_none=True)
        reference_loss(task, model(x[rows]), y[rows]).sum().backward()
        out.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    model.zero_grad(set_to_none=True)
    return torch.stack(out)


def clipped_reference(grads, max_norm):
    norms = grads.norm(dim=1)
    factor = torch.clamp(max_norm / norms, max=1.0)
    return (grads * factor[:, None]).sum(0), norms


def bookkeeping(model, task, x, y, max_norm, units=None, pad=None, n_units=None):
    tape = clipping.Tape()
    out = clipping.forward(model, x, tape)
    reference_loss(task, out, y).sum().backward()
    norms = clipping.clipped_sum(tape, max_norm, units, pad, n_units)
    grad = torch.cat([p.grad.flatten() for p in model.parameters()])
    return grad, norms, out


def random_units(n_rows, n_units, extra_pad, gen):
    """Row -> unit (every unit has a row), and the [n_units, k] pad table (-1 padded,
    rows of a unit in random order, k possibly larger than the largest unit)."""
    units = torch.cat([torch.arange(n_units), torch.randint(n_units, (n_rows - n_units,), generator=gen)])
    units = units[torch.randperm(n_rows, generator=gen)]
    members = [torch.nonzero(units == u).flatten() for u in range(n_units)]
    members = [m[torch.randperm(len(m), generator=gen)] for m in members]
    k = max(len(m) for m in members) + extra_pad
    pad = torch.full((n_units, k), -1, dtype=torch.long)
    for u, m in enumerate(members):
        pad[u, :len(m)] = m
    return units, pad, members


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=st.lists(block, min_size=1, max_size=3), task=st.sampled_from(TASKS), n_in=st.integers(1, 5),
       n_rows=st.integers(1, 9), seed=st.integers(0, 2**31 - 1), clip_quantile=st.floats(0.0, 1.0))
def test_row_level_clipped_sum_equals_the_per_sample_loop(blocks, task, n_in, n_rows, seed, clip_quantile):
    gen = torch.Generator().manual_seed(seed)
    n_out = 3 if task == "multiclass" else 1
    model = make_model(blocks, n_in, n_out, seed)
    x = torch.randn(n_rows, n_in, generator=gen, dtype=torch.float64)
    y = make_targets(task, n_rows, n_out, gen)

    grads = unit_grads(model, task, x, y, [[i] for i in range(n_rows)])
    # A clipping norm that clips some samples and not others.
    max_norm = float(torch.quantile(grads.norm(dim=1), clip_quantile)) + 1e-3
    want, want_norms = clipped_reference(grads, max_norm)

    got, norms, out = bookkeeping(model, task, x, y, max_norm)
    torch.testing.assert_close(out, model(x), rtol=1e-12, atol=1e-12)  # forward is model(x)
    torch.testing.assert_close(norms, want_norms, rtol=1e-7, atol=1e-10)
    torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-6 * n_rows)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=st.lists(block, min_size=1, max_size=3), task=st.sampled_from(TASKS), n_in=st.integers(1, 5),
       n_units=st.integers(1, 5), extra_rows=st.integers(0, 8), extra_pad=st.integers(0, 2),
       seed=st.integers(0, 2**31 - 1), clip_quantile=st.floats(0.0, 1.0))
def test_unit_level_clipped_sum_equals_the_per_unit_loop(blocks, task, n_in, n_units, extra_rows, extra_pad, seed,
                                                        clip_quantile):
    gen = torch.Generator().manual_seed(seed)
    n_out = 4 if task == "multiclass" else 1
    model = make_model(blocks, n_in, n_out, seed)
    n_rows = n_units + extra_rows
    x = torch.randn(n_rows, n_in, generator=gen, dtype=torch.float64)
    y = make_targets(task, n_rows, n_out, gen)
    units, pad, members = random_units(n_rows, n_units, extra_pad, gen)

    grads = unit_grads(model, task, x, y, members)  # the unit's gradient: sum over its rows
    max_norm = float(torch.quantile(grads.norm(dim=1), clip_quantile)) + 1e-3
    want, want_norms = clipped_reference(grads, max_norm)

    got, norms, _ = bookkeeping(model, task, x, y, max_norm, units, pad, n_units)
    assert norms.shape == (n_units,)
    torch.testing.assert_close(norms, want_norms, rtol=1e-7, atol=1e-10)  # per-unit, not per-row, norms
    torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-6 * n_units)


def test_units_are_clipped_as_a_whole_not_row_by_row():
    # Two identical rows in one unit: the unit's gradient is twice a row's, so its norm is
    # twice a row's norm and the clipped sum has norm max_norm (row-wise clipping would
    # give 2 max_norm). The row-level call on the same data shows the difference.
    model = make_model([{"out": 4, "norm": "layernorm", "act": "tanh", "dropout": False}], 3, 1, 0)
    x = torch.tensor([[0.3, -1.0, 2.0], [0.3, -1.0, 2.0]], dtype=torch.float64)
    y = torch.tensor([1.0, 1.0], dtype=torch.float64)
    _, row_norms, _ = bookkeeping(model, "regression", x, y, 1e9)
    row = float(row_norms[0].detach())
    max_norm = row / 10
    units, pad = torch.tensor([0, 0]), torch.tensor([[0, 1]])
    got, norms, _ = bookkeeping(model, "regression", x, y, max_norm, units, pad, 1)
    assert float(norms[0]) == pytest.approx(2 * row, rel=1e-12)
    assert float(got.norm()) == pytest.approx(max_norm, rel=1e-5)
    got_rows, _, _ = bookkeeping(model, "regression", x, y, max_norm)
    assert float(got_rows.norm()) == pytest.approx(2 * max_norm, rel=1e-5)


def test_dropout_layers_with_p_above_zero_use_the_same_masks_as_the_module():
    # With dropout active, compare with the batched module under the same random masks:
    # rows do not interact, so each unit's gradient is the gradient of its rows' losses.
    layers, _ = expand_model({"layers": [{"type": "linear", "out": 6}, {"type": "dropout", "p": 0.4},
                                         {"type": "relu"}, {"type": "linear", "out": 5},
                                         {"type": "groupnorm", "groups": 1}, {"type": "dropout", "p": 0.3}]},
                             3, 1)
    torch.manual_seed(3)
    model = build(layers).double()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(7, 3, generator=gen, dtype=torch.float64)
    y = torch.rand(7, generator=gen, dtype=torch.float64)
    units, pad, members = random_units(7, 3, 1, gen)
    torch.manual_seed(11)
    got, norms, _ = bookkeeping(model, "regression", x, y, 0.05, units, pad, 3)
    torch.manual_seed(11)
    losses = reference_loss("regression", model(x), y)
    grads = torch.stack([torch.cat([g.flatten() for g in torch.autograd.grad(losses[m].sum(), list(model.parameters()),
                                                                              retain_graph=True)])
                         for m in members])
    want, want_norms = clipped_reference(grads, 0.05)
    torch.testing.assert_close(norms, want_norms, rtol=1e-7, atol=1e-10)
    torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-5)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=st.lists(block, min_size=1, max_size=3), task=st.sampled_from(TASKS), n_rows=st.integers(1, 8),
       seed=st.integers(0, 2**31 - 1))
def test_per_sample_norms_match_opacus_grad_sample_module(blocks, task, n_rows, seed):
    from opacus import GradSampleModule

    gen = torch.Generator().manual_seed(seed)
    n_out = 3 if task == "multiclass" else 1
    model = make_model(blocks, 4, n_out, seed)
    x = torch.randn(n_rows, 4, generator=gen, dtype=torch.float64)
    y = make_targets(task, n_rows, n_out, gen)

    # GradSampleModule is Opacus's grad_sample_mode="hooks" class (force_functorch=False: its
    # per-layer hook formulas for Linear, LayerNorm and GroupNorm, not functorch).
    gsm = GradSampleModule(copy.deepcopy(model), loss_reduction="sum", force_functorch=False)
    reference_loss(task, gsm(x), y).sum().backward()
    opacus_norms = torch.stack([p.grad_sample.reshape(n_rows, -1).norm(dim=1) for p in gsm.parameters()]).norm(dim=0)

    _, norms, _ = bookkeeping(model, task, x, y, 1.0)
    torch.testing.assert_close(norms, opacus_norms, rtol=1e-7, atol=1e-10)


def test_the_engine_loss_is_the_reference_loss():
    # train.row_losses is what the trainer backpropagates; the references above use their own.
    gen = torch.Generator().manual_seed(0)
    out1, out3 = torch.randn(6, 1, generator=gen), torch.randn(6, 3, generator=gen)
    for task, out in (("binary", out1), ("multiclass", out3), ("regression", out1)):
        y = make_targets(task, 6, 3, gen)
        y = y.float() if task != "multiclass" else y
        torch.testing.assert_close(train.row_losses(task, out, y), reference_loss(task, out, y))


def test_layers_it_cannot_clip_are_refused():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    with pytest.raises(TypeError, match="BatchNorm1d"):
        clipping.forward(model, torch.randn(5, 3), clipping.Tape())


def test_clipped_gradients_do_not_accumulate_across_steps():
    # Each step writes (not adds) the clipped sum into .grad: a second step on other data
    # gives that data's clipped sum, not the total of both.
    model = make_model([{"out": 3, "norm": None, "act": "relu", "dropout": False}], 2, 1, 5)
    gen = torch.Generator().manual_seed(2)
    x1, x2 = torch.randn(4, 2, generator=gen, dtype=torch.float64), torch.randn(4, 2, generator=gen, dtype=torch.float64)
    y = torch.rand(4, generator=gen, dtype=torch.float64)
    bookkeeping(model, "regression", x1, y, 0.1)
    got, norms, _ = bookkeeping(model, "regression", x2, y, 0.1)
    # Plain tensors, not nodes of the forward's graph (inner layers' inputs require grad).
    assert not norms.requires_grad
    assert all(p.grad.is_leaf and not p.grad.requires_grad for p in model.parameters())
    want, _ = clipped_reference(unit_grads(model, "regression", x2, y, [[i] for i in range(4)]), 0.1)
    torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-5)


@pytest.mark.parametrize("norm", [None, "layernorm"])
def test_a_step_leaves_nothing_behind_once_its_tape_is_dropped(norm):
    # The graph's nodes must not keep the tape (which keeps the layers' inputs, whose grad_fn
    # are those nodes): autograd nodes are outside Python's cycle collector, so such a cycle
    # kept every step's inputs and graph for good (a worker grew by 0.6 MB a step).
    import gc
    import weakref

    model = make_model([{"out": 8, "norm": norm, "act": "relu", "dropout": False}] * 2, 5, 1, 3)
    x = torch.randn(16, 5, dtype=torch.float64)
    tape = clipping.Tape()
    out = clipping.forward(model, x, tape)
    reference_loss("regression", out, torch.rand(16, dtype=torch.float64)).sum().backward()
    clipping.clipped_sum(tape, 0.5)
    inner = weakref.ref(tape.layers[-1][2])  # the last layer's input: a node of the graph
    gone = weakref.ref(tape)
    del tape, out
    gc.collect()
    assert gone() is None and inner() is None
