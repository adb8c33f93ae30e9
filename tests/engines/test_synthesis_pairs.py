"""A pair's exact counts are kept sparse (``mst.PairCounts``): the same numbers as the dense
bincount, additive over parts of a table, and compressed to the model cells alike; a pair
of two 16,384-cell columns costs its rows, not 268 million cells."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.synthesis import mst


def dense(counts: mst.PairCounts, size: int) -> np.ndarray:
    out = np.zeros(size, dtype=np.int64)
    out[counts.index] = counts.count
    return out


@settings(max_examples=60, deadline=None)
@given(sa=st.integers(1, 9), sb=st.integers(1, 9), n=st.integers(0, 300), cut=st.integers(0, 300),
       seed=st.integers(0, 2**32 - 1))
def test_sparse_counts_equal_the_dense_ones_sum_over_parts_and_compress_alike(sa, sb, n, cut, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, sa, n), rng.integers(0, sb, n)
    codes = {"a": a, "b": b}
    got = mst.marginal_counts(codes, {"a": sa, "b": sb})["two"]["a", "b"]
    want = np.bincount(a * sb + b, minlength=sa * sb)
    np.testing.assert_array_equal(dense(got, sa * sb), want)
    assert np.all(got.count > 0) and np.all(np.diff(got.index) > 0)

    cut = min(cut, n)
    parts = [mst.marginal_counts({"a": a[s], "b": b[s]}, {"a": sa, "b": sb})["two"]["a", "b"]
             for s in (slice(0, cut), slice(cut, n))]
    assert sum(parts) == got

    ma, mb = rng.integers(0, 3, sa), rng.integers(0, 3, sb)  # any measured cell -> model cell maps
    ma[0] = mb[0] = 2  # every model cell index exists
    ca, cb = int(ma.max()) + 1, int(mb.max()) + 1
    want_model = np.zeros((ca, cb))
    np.add.at(want_model, (ma[a], mb[b]), 1)
    np.testing.assert_array_equal(mst._compressed_pair(got, ma, mb), want_model.ravel())


def test_a_pair_of_two_fine_columns_costs_its_rows_not_its_cells():
    size = 16_385  # a continuous column's tree cells on a table above 32,768 rows, with its null cell
    rng = np.random.default_rng(0)
    codes = {"x": rng.integers(0, size, 50_000), "y": rng.integers(0, size, 50_000)}
    got = mst.marginal_counts(codes, {"x": size, "y": size})["two"]["x", "y"]
    assert got.index.nbytes + got.count.nbytes <= 16 * 50_000  # the dense array: 2.1 GB
    assert int(got.count.sum()) == 50_000 and got.index.max() < size * size
