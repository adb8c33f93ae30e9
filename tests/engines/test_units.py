"""Privacy units (engines/aggregates/units.py): codes that name each unit exactly once,
whatever the ids' range, and the bounded count equal to counting the rows the bound keeps."""

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.aggregates import units


def _assert_codes_name_units(ids: np.ndarray, table: pa.Table) -> np.ndarray:
    codes, n = units.unit_codes(table, "u")
    assert len(codes) == len(ids)
    assert codes.min(initial=0) >= 0 and codes.max(initial=-1) < n
    pairs = set(zip(ids.tolist(), codes.tolist()))
    # one code per id, one id per code
    assert len({i for i, _ in pairs}) == len(pairs) == len({c for _, c in pairs})
    return codes


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=400), st.integers(1, 4))
def test_codes_of_wide_range_integer_ids_are_one_to_one(distinct, repeat):
    ids = np.repeat(np.array(distinct, dtype=np.int64), repeat)
    np.random.default_rng(0).shuffle(ids)
    _assert_codes_name_units(ids, pa.table({"u": ids}))


def test_slot_codes_resolve_collisions():
    """Many ids over a wide range in few slots: some ids lose their slot, and are coded apart."""
    rng = np.random.default_rng(3)
    distinct = rng.choice(2**40, size=3_000, replace=False).astype(np.int64) * 7919
    ids = rng.choice(distinct, size=4_000)
    codes = _assert_codes_name_units(ids, pa.table({"u": ids}))
    size = 1 << max(10, (2 * len(ids) - 1).bit_length())
    assert (codes >= size).any(), "the test should make ids collide"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "ccc", "", "é"]), min_size=1, max_size=50))
def test_codes_of_string_ids_are_one_to_one(ids):
    _assert_codes_name_units(np.array(ids, dtype=object), pa.table({"u": pa.array(ids)}))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=300), st.integers(1, 5), st.integers(0, 2**63 - 1),
       st.booleans(), st.booleans())
def test_bounded_count_counts_the_rows_the_bound_keeps(unit_ids, k, salt, wide, masked):
    ids = np.array(unit_ids, dtype=np.int64) * (2**40 if wide else 1)
    table = pa.table({"u": ids})
    codes, n = units.unit_codes(table, "u")
    mask = (np.arange(len(ids)) % 3 != 0) if masked else np.ones(len(ids), dtype=bool)
    kept, _ = units.bound_by_content(mask, codes, n, k, salt, table.column("u"))
    assert units.bounded_count(mask, codes, n, k) == int(np.count_nonzero(kept))
    per_unit = {i: min(int(np.count_nonzero(mask & (ids == i))), k) for i in set(ids.tolist())}
    assert units.bounded_count(mask, codes, n, k) == sum(per_unit.values())


def test_a_unit_bucket_s_ids_keep_their_slots():
    """The ids of one engines/distributed unit bucket (their Fibonacci hash shares its top
    byte modulo the bucket count) spread over the whole slot table: about as few lose
    their slot as for ids drawn at random (~ distinct / 4 at 2n slots), not most of them."""
    from engines.distributed.cluster import _bucket_of

    rng = np.random.default_rng(5)
    ids = rng.integers(0, 2_000_000, 800_000)
    bucket = ids[_bucket_of(pa.array(ids), 40) == 7]
    codes = _assert_codes_name_units(bucket, pa.table({"u": bucket}))
    size = 1 << max(10, (2 * len(bucket) - 1).bit_length())
    lost = len(np.unique(bucket[codes >= size]))
    assert lost < 0.3 * len(np.unique(bucket))


def _reference_keep(hu, key, codes, values, k) -> list:
    """Each unit's k first rows in (key, code, value) order, as sorted (unit, key, code, value)
    tuples: the multiset ``units._smallest_k`` must keep."""
    rows = sorted(zip(hu.tolist(), key.tolist(), codes.tolist(), values.tolist()))
    kept, seen = [], {}
    for r in rows:
        seen[r[0]] = seen.get(r[0], 0) + 1
        if seen[r[0]] <= k:
            kept.append(r)
    return kept


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 2**64 - 1), st.integers(0, 2), st.integers(0, 2)),
                min_size=1, max_size=120),
       st.integers(1, 4), st.sampled_from([0, 2**62, 2**64 - 4]), st.booleans())
def test_the_rows_kept_are_each_units_k_smallest_by_key_then_content(rows, k, squeeze, low_bits_only):
    """Against a sort in plain Python, with keys squeezed into a few values (ties on the
    whole key) or differing only in their low bits (ties on the sorted high bits)."""
    hu = np.array([r[0] for r in rows], dtype=np.int32)
    key = np.array([r[1] for r in rows], dtype=np.uint64)
    if squeeze:
        key = key % np.uint64(3) + np.uint64(squeeze)
    if low_bits_only:
        key = key % np.uint64(8)
    codes = np.array([r[2] for r in rows], dtype=np.int64)
    values = np.array([float(r[3]) for r in rows])
    keep = units._smallest_k(hu, key, codes, values, k)
    got = sorted(zip(hu[keep].tolist(), key[keep].tolist(), codes[keep].tolist(), values[keep].tolist()))
    assert got == _reference_keep(hu, key, codes, values, k)
