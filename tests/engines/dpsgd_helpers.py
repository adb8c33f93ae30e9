"""Shared pieces of the dpsgd engine tests: a tiny synthetic dataset with its declared
metadata, and a fixture that runs torch on one thread (on a 2-core machine the
intra-op thread hand-off costs far more than the tiny tensors' arithmetic)."""

import numpy as np
import pyarrow as pa
import pytest
import torch

from engines.types import DatasetMeta

N_ROWS = 2000
N_UNITS = 500
DELTA = 1e-5


def ledger_epsilon(event, delta=DELTA):
    """What the ledger reports for the event's fixed composition under RDP: the order
    refined off the grid (its ``refined_epsilon``), which the run calibrates to and reports;
    the grid's best order is never lower."""
    from accounting import rdp
    from accounting.costs import price
    from accounting.events import parse_event

    refined = rdp.compose([parse_event(event)], delta).epsilon
    assert refined <= rdp.spent(price(parse_event(event), delta).cost, delta).epsilon
    return refined


COLUMNS = {
    "pid": {"type": "unit"},
    "x1": {"type": "numeric", "lower": -3, "upper": 3},
    "x2": {"type": "numeric", "lower": -3, "upper": 3},
    "c": {"type": "categorical", "domain": ["a", "b", "c"]},
    "y": {"type": "categorical", "domain": ["no", "yes"]},
    "klass": {"type": "categorical", "domain": ["k0", "k1", "k2"]},
    "r": {"type": "numeric", "lower": -10, "upper": 10},
    "notes": {"type": "text"},
}


def make_table(n=N_ROWS, n_units=N_UNITS, seed=0) -> pa.Table:
    """A learnable table: y = [x1 + x2 + (c == a) > 0.5] (about balanced), a 3-class
    target from x1, a regression target r = 2 x1 - x2 (+ noise), pid a unit column."""
    rng = np.random.default_rng(seed)
    x1, x2 = rng.uniform(-3, 3, n), rng.uniform(-3, 3, n)
    c = rng.choice(["a", "b", "c"], n)
    y = (x1 + x2 + (c == "a")) > 0.5
    klass = np.where(x1 < -1, "k0", np.where(x1 < 1, "k1", "k2"))
    r = 2 * x1 - x2 + rng.normal(0, 0.3, n)
    pid = np.concatenate([np.arange(n_units), rng.integers(0, n_units, n - n_units)])
    rng.shuffle(pid)
    return pa.table({"pid": pid, "x1": x1, "x2": x2, "c": c, "y": np.where(y, "yes", "no"), "klass": klass, "r": r,
                     "notes": ["free text"] * n})


def rows_meta(n=N_ROWS, delta=DELTA) -> DatasetMeta:
    """The table with one row per privacy unit (no unit column)."""
    cols = {k: v for k, v in COLUMNS.items() if k != "pid"}
    return DatasetMeta(name="tiny", columns=cols, unit_column=None, n_rows=n, n_units=n, delta=delta)


def units_meta(n=N_ROWS, n_units=N_UNITS, delta=DELTA) -> DatasetMeta:
    return DatasetMeta(name="tiny-units", columns=dict(COLUMNS), unit_column="pid", n_rows=n, n_units=n_units,
                       delta=delta)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# A training request at a generous epsilon on the rows dataset (q = 64 / 1600, 25 steps
# per epoch); planning and training tests use the same one, so its noise calibration
# (cached per sampling rate and noise multiplier by the accountant) is paid once.
GENEROUS = {"target": "y", "features": ["x1", "x2", "c"], "target_epsilon": 8.0, "eval_epsilon": 2.0, "epochs": 3,
            "batch_size": 64, "model": {"hidden": [16]}, "learning_rate": 0.02, "canaries": 20}
