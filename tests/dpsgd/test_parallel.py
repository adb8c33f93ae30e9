"""Data-parallel DP-SGD (engines/dpsgd/parallel.py) on two real processes joined by a gloo
group over loopback: the noise of the averaged update is added once, with the standard
deviation the accountant assumes (z C / global expected batch), not sqrt(2) more or less;
replicas start and stay equal; and the plan of a 2-rank run is that of a 1-rank run."""

import dataclasses
import json
import multiprocessing as mp

import numpy as np
import pytest
import torch

from engines import plugins
from engines.dpsgd import parallel, train
from engines.dpsgd.params import validate
from engines.types import EngineRequest
from tests.engines.dpsgd_helpers import make_table, rows_meta

FIXED = {"target": "y", "features": ["x1", "x2", "c"], "noise_multiplier": 1.0, "epochs": 1, "batch_size": 64,
         "model": {"hidden": [64, 64]}, "learning_rate": 0.02, "canaries": 0, "max_grad_norm": 0.5}
Z, Q = 40.0, 64 / 1600
N_ZERO = 40_000  # coordinates of the pure-noise update: its std is estimated within ~0.4%


def _rank(rank: int, size: int, addresses, results) -> None:
    torch.set_num_threads(1)
    dev = torch.device("cpu")
    if rank == 0:
        group = parallel.connect(0, size, "127.0.0.1", None, dev, publish=addresses.put, timeout_s=60)
    else:
        group = parallel.connect(rank, size, "127.0.0.1", addresses.get(timeout=60), dev, timeout_s=60)
    gen = torch.Generator().manual_seed(1000 + rank)
    # 1. Clipped sums that are zero on every rank: the update is pure noise.
    zero = [torch.nn.Parameter(torch.zeros(N_ZERO))]
    zero[0].grad = torch.zeros(N_ZERO)
    group.noisy_mean(zero, Z * 0.5, 25.0, lambda sd, like: train._noise(sd, like, gen))
    # 2. The real trainer's step, each rank on its half of the rows.
    spec = validate("train", FIXED, rows_meta())
    table = make_table()
    half = table.slice(rank * table.num_rows // size, table.num_rows // size)
    prep = train.prepare(half, spec, torch.Generator().manual_seed(rank), dev)
    trainer = train.Trainer(spec, prep, q=Q, z=Z, steps_per_epoch=1, gen=gen, group=group)
    start = torch.cat([p.detach().flatten() for p in trainer.model.parameters()]).clone()
    trainer.step()
    grad = torch.cat([p.grad.flatten() for p in trainer.model.parameters()]).double()
    trainer.step()
    after = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    results.put((rank, zero[0].grad.double().numpy(), grad.numpy(), start.numpy(), after.numpy(),
                 spec.n_train_units))


@pytest.fixture(scope="module")
def two_ranks():
    ctx = mp.get_context("spawn")
    addresses, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, 2, addresses, results)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        out = {r[0]: r[1:] for r in (results.get(timeout=120) for _ in procs)}
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return out


def test_a_pure_noise_update_has_the_accountants_standard_deviation(two_ranks):
    # sigma = z C = 20, divided by the global expected batch (25): 0.8 per coordinate.
    # Noise from both ranks would be 0.8 sqrt(2) = 1.13; a 1/sqrt(2) share each, 0.57.
    g0, g1 = two_ranks[0][0], two_ranks[1][0]
    assert np.array_equal(g0, g1)  # every rank holds the same averaged update
    assert float(g0.std()) == pytest.approx(Z * 0.5 / 25.0, rel=0.03)
    assert abs(float(g0.mean())) < 0.03 * 0.8


def test_the_trainers_step_adds_the_noise_once_over_the_ranks(two_ranks):
    # As tests/engines/test_dpsgd_train.py's single-process test: the clipped sums are
    # negligible beside z C, so the update's std is z C / (q n) with n the whole table's units.
    g0, g1 = two_ranks[0][1], two_ranks[1][1]
    n = two_ranks[0][4]
    assert np.array_equal(g0, g1)
    assert len(g0) > 4000
    assert float(g0.std() * Q * n) == pytest.approx(Z * 0.5, rel=0.05)


def test_replicas_start_and_stay_equal(two_ranks):
    assert np.array_equal(two_ranks[0][2], two_ranks[1][2])  # rank 0's initial weights, broadcast
    assert np.array_equal(two_ranks[0][3], two_ranks[1][3])  # the same update applied on both
    assert not np.array_equal(two_ranks[0][2], two_ranks[0][3])


def test_the_plan_does_not_depend_on_the_number_of_ranks():
    ds = dataclasses.replace(rows_meta(), distributed=True)
    params = {k: v for k, v in FIXED.items() if k != "noise_multiplier"} | {"target_epsilon": 2.0}
    one = plugins.plan("dpsgd", EngineRequest("train", params), ds)
    four = plugins.plan("dpsgd", EngineRequest("train", {**params, "ranks": 4}), ds)
    assert json.dumps(one.event, sort_keys=True) == json.dumps(four.event, sort_keys=True)
    assert one.details["sample_rate"] == four.details["sample_rate"]
    assert one.details["runs"][0]["noise_multiplier"] == four.details["runs"][0]["noise_multiplier"]
    assert four.details["spec"]["ranks"] == 4


@pytest.mark.parametrize("bad, why", [(0, ">= 1"), (-1, ">= 1"), (65, "<= 64"), (1.5, "integer"), ("2", "integer"),
                                      (True, "integer")])
def test_a_bad_number_of_ranks_is_refused_with_the_reason(bad, why):
    from engines.types import PlanError

    params = {k: v for k, v in FIXED.items() if k != "noise_multiplier"} | {"target_epsilon": 2.0, "ranks": bad}
    with pytest.raises(PlanError) as got:
        plugins.plan("dpsgd", EngineRequest("train", params), dataclasses.replace(rows_meta(), distributed=True))
    assert why in got.value.errors["ranks"]


def test_ranks_on_a_local_dataset_are_refused_not_ignored():
    from engines.types import PlanError

    params = {k: v for k, v in FIXED.items() if k != "noise_multiplier"} | {"target_epsilon": 2.0, "ranks": 2}
    with pytest.raises(PlanError) as got:
        plugins.plan("dpsgd", EngineRequest("train", params), rows_meta())
    assert "distributed dataset" in got.value.errors["ranks"]
    assert plugins.plan("dpsgd", EngineRequest("train", {**params, "ranks": 1}), rows_meta())
