"""Privacy units: which unit each row belongs to (``unit_codes``, ``unit_hash``) and how
many of its rows a unit keeps (contribution bounding).

Which rows a unit with more than k keeps (``bound_by_content``, the aggregates engine's
rule) are the k rows with the smallest salted hash of (unit id, the row's contribution):
a function of the unit's own rows and the salt only, so any partitioning of the table (a
Dask cluster that never brings the whole table together in one place, see
engines/distributed) keeps the same rows as one process with the same salt; the salt is
drawn per run, so which rows a unit keeps differs from run to run as a random choice
would. ``bounded_count`` is the same rule's count without choosing rows (every row of a
unit adds one). ``bound_contributions`` (a uniform random choice with numpy's generator)
is kept for the synthesis engine. None of this is released noise: DP holds whatever rows
are kept, as long as each unit keeps at most k and its choice does not depend on other
units' rows.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..columns import unit_ids

__all__ = ["compact", "unit_codes", "integer_ids", "unit_hash", "mix64", "row_keys", "first_per_pair", "bound_by_content",
           "bounded_count", "bound_contributions"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def first_per_pair(mask: np.ndarray, units: np.ndarray, codes: np.ndarray | None) -> np.ndarray:
    """``mask`` keeping only the first selected row of each (unit, group) pair."""
    idx = np.flatnonzero(mask)
    if idx.size == 0:
        return mask
    key = units[idx].astype(np.int64)
    if codes is not None:
        key = key * (int(codes.max()) + 1) + codes[idx]
    _, first = np.unique(key, return_index=True)
    out = np.zeros_like(mask)
    out[idx[first]] = True
    return out



def compact(lo: int, hi: int, rows: int) -> bool:
    """Whether integer ids in [lo, hi] over ``rows`` rows are coded by ``id - lo`` (under 4
    ids per row): ``unit_codes``' rule, and engines/distributed's for range buckets (so
    each bucket's ids take that path)."""
    return hi - lo < 4 * rows + 1024


def unit_codes(table: pa.Table, name: str) -> tuple[np.ndarray, int]:
    """An integer code per row naming its privacy unit, and the number of codes (an upper
    bound of the units present: codes need not be dense).

    Integer ids in a compact range are used directly (offset by the minimum); other
    integer ids by their slot in a table of at least 2n slots (``_slot_codes``); anything
    else is dictionary-encoded. Null ids (refused at registration) would share one code:
    merging units only tightens the bound."""
    col = unit_ids(table.column(name))
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.int32), 0
    if pa.types.is_integer(arr.type) and arr.null_count == 0:
        v = arr.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        lo, hi = int(v.min()), int(v.max())
        if compact(lo, hi, n):
            return (v - lo).astype(np.int32), hi - lo + 1
        return _slot_codes(v)
    return _dictionary_codes(arr)


def _dictionary_codes(arr: pa.Array) -> tuple[np.ndarray, int]:
    enc = pc.dictionary_encode(arr)
    nd = len(enc.dictionary)
    codes = enc.indices.fill_null(nd).to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    return codes, nd + 1


def _slot_codes(v: np.ndarray) -> tuple[np.ndarray, int]:
    """Codes for integer ids spread over a wide range (a unit bucket of engines/distributed
    holds ids from all over the table's range), without a hash table per row: each id's
    slot among S >= 2n by a Fibonacci hash (one multiplication). A slot names the one id
    written to it last; the ids that lost their slot to another (about units / 2S of them)
    are dictionary-encoded and coded from S up. Every row of an id gets the same code, and
    two ids never share one.

    The slot is the product's ``bits`` bits *below* its top byte: engines/distributed deals
    ids into unit buckets by that top byte (``cluster._bucket_of``), so within one bucket
    the top byte takes only a few values, and slots taken from it would crowd most ids
    into a few hundredths of the table (85% of them lost their slot on a bucket of a
    100M-row table)."""
    bits = min(56, max(10, (2 * len(v) - 1).bit_length()))
    size = 1 << bits
    with np.errstate(over="ignore"):
        slot = v.view(np.uint64) * _GOLDEN
    slot <<= np.uint64(8)
    slot >>= np.uint64(64 - bits)
    slot = slot.view(np.int64)
    owner = np.empty(size, dtype=np.int64)
    owner[slot] = v
    lost = np.flatnonzero(owner[slot] != v)
    if lost.size == 0:
        return slot, size
    codes, n_lost = _dictionary_codes(pa.array(v[lost]))
    slot[lost] = size + codes
    return slot, size + n_lost


# --------------------------------------------------------------------------- contribution bounding


def _keep_first_k(units: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Sort rows by (unit, random key) and keep each unit's first k."""
    key = (units.astype(np.uint64) << np.uint64(32)) | rng.integers(0, 2**32, len(units), dtype=np.uint64)
    order = np.argsort(key)
    keep = np.empty(len(units), dtype=bool)
    keep[order] = _first_k(units[order], k)
    return keep


def _over_k(mask: np.ndarray, units: np.ndarray, n_units: int, k: int):
    """The rows of ``mask`` to choose among: (their unit codes, their row indices), or None
    when no unit has more than ``k``. The rows of units over k; or every row of ``mask``
    when those are most of them (a unit with at most k rows keeps them all whichever way
    its rows are ranked, and selecting would cost more than it saves)."""
    every = bool(mask.all())
    idx = None if every else np.flatnonzero(mask)
    u = units if every else units[idx]
    counts = np.bincount(u, minlength=n_units)
    if counts.size == 0 or counts.max() <= k:
        return None
    over = counts > k
    if 2 * int(counts[over].sum()) > len(u):
        return u, (np.arange(len(u)) if every else idx)
    heavy_rows = np.flatnonzero(over[u])  # positions in u of rows of units over k
    return u[heavy_rows], (heavy_rows if every else idx[heavy_rows])


def _first_k(sorted_units: np.ndarray, k: int) -> np.ndarray:
    """For rows sorted by unit: whether each is among its unit's first ``k`` (the row k
    places earlier belongs to another unit)."""
    first = np.ones(len(sorted_units), dtype=bool)
    if len(sorted_units) > k:
        first[k:] = sorted_units[k:] != sorted_units[:-k]
    return first


def bound_contributions(mask: np.ndarray, units: np.ndarray, n_units: int, k: int,
                        rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Keep at most ``k`` of each unit's rows among ``mask``, chosen uniformly at random
    (independently per unit). Returns the new mask and the number of rows dropped."""
    heavy = _over_k(mask, units, n_units, k)
    if heavy is None:
        return mask, 0
    hu, hidx = heavy
    if k == 1:
        # One row per unit: the row with the largest random key, a uniform choice.
        keys = rng.integers(0, 2**32, len(hu), dtype=np.uint32)
        best = np.zeros(n_units, dtype=np.uint32)
        np.maximum.at(best, hu, keys)
        keep = keys == best[hu]
        tied = keep & (np.bincount(hu[keep], minlength=n_units) > 1)[hu]  # equal keys: rare
        if tied.any():
            at = np.flatnonzero(tied)
            keep[at] = _keep_first_k(hu[at], 1, rng)
    else:
        keep = _keep_first_k(hu, k, rng)
    out = mask.copy()
    out[hidx[~keep]] = False
    return out, int(len(keep) - np.count_nonzero(keep))


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic): a bijection that
    spreads every input bit over the output; the same on every machine."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64, copy=True)
        z += _GOLDEN
        z ^= z >> np.uint64(30)
        z *= _MIX1
        z ^= z >> np.uint64(27)
        z *= _MIX2
        z ^= z >> np.uint64(31)
    return z


def integer_ids(col, null: int = 0) -> np.ndarray | None:
    """The ids of an integer column (``pa.Array`` / ``ChunkedArray``) as int64, a null as
    ``null``; None for any other type. Decided by the type, never by whether this piece of
    the column holds a null: every partition, and every subset of a unit's rows, must
    treat an id alike."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if not pa.types.is_integer(col.type):
        return None
    if col.null_count:
        col = col.fill_null(null)
    return col.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def unit_hash(col) -> np.ndarray:
    """A 64-bit hash of each privacy-unit id (``pa.Array`` / ``ChunkedArray``) that depends on
    the id's value only: the same in every partition, process and machine (integers by
    their value, anything else by pandas' ``hash_array``, SipHash with a fixed key)."""
    import pandas as pd

    col = unit_ids(col)
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    ints = integer_ids(col)
    if ints is not None:
        return mix64(ints.view(np.uint64))
    return pd.util.hash_array(np.asarray(col.to_numpy(zero_copy_only=False)))


_C_CODE = np.uint64(0xD6E8FEB86659FD93)
_C_VALUE = np.uint64(0xA0761D6478BD642F)


def row_keys(ids, rows: np.ndarray, salt: int, codes: np.ndarray | None, values: np.ndarray | None) -> np.ndarray:
    """Each row's bounding key: ``mix64(h(id) ^ salt ^ code * c1 ^ value bits * c2)``, a
    function of the row's unit id, group code and value and the run's salt only. ``h`` is
    one multiplication for integer ids (``mix64`` spreads it), ``unit_hash`` otherwise;
    ``rows`` index ``ids`` (the unit column), ``codes`` and ``values`` are already those
    rows'. Two rows of a unit with other (code, value) may share a key: the caller breaks
    such ties by (code, value)."""
    col = ids.take(pa.array(rows)) if not isinstance(ids, np.ndarray) else ids[rows]
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if isinstance(col, np.ndarray):
        ints = col.astype(np.int64, copy=False).view(np.uint64) if col.dtype.kind in "iu" else None
    else:  # a unit's keys must not depend on which other rows are taken with it (a null id keys as 0)
        ints = integer_ids(col)
        ints = ints.view(np.uint64) if ints is not None else None
    with np.errstate(over="ignore"):
        key = ints * _GOLDEN if ints is not None else unit_hash(col)
        key ^= np.uint64(salt & 0xFFFFFFFFFFFFFFFF)
        if codes is not None:
            key ^= codes.astype(np.int64).view(np.uint64) * _C_CODE
        if values is not None:
            key ^= values.view(np.uint64) * _C_VALUE
    return mix64(key)


def _smallest_k(hu: np.ndarray, key: np.ndarray, c, v, k: int) -> np.ndarray:
    """Whether each row is among its unit's ``k`` first in (key, code, value) order (rows
    equal in all three are interchangeable: which of them is kept does not change the
    multiset). One sort of the values ``unit << (64 - b) | key >> b`` (b bits hold the unit
    codes; the truncated key orders as the key does wherever it differs), each unit's k-th
    sorted value its threshold, the rows at or below it kept. Where a unit's threshold value
    is shared by a row past its k first (a tie: rows equal in content, or keys equal in
    their high bits), its rows at the threshold are ranked (by their unit alone when they
    are equal in content, else by unit, key, code and value) and the first ones kept. No
    argsort of every row: sorting the values costs a third of it."""
    bits = max(int(hu.max()).bit_length(), 1)
    shift = np.uint64(64 - bits)
    comp = (hu.astype(np.uint64) << shift) | (key >> np.uint64(bits))
    s = np.sort(comp)
    su = (s >> shift).astype(np.int64)
    first = _first_k(su, k)
    last = first.copy()  # each unit's last row among its first k: its threshold
    last[:-1] &= ~(first[1:] & (su[1:] == su[:-1]))
    last = np.flatnonzero(last)
    thr = np.zeros(int(su[-1]) + 1, dtype=np.uint64)
    thr[su[last]] = s[last]
    at_thr = thr[hu]
    keep = comp <= at_thr
    tie = last[:-1] if last[-1] == s.size - 1 else last
    tie = tie[s[tie + 1] == s[tie]]
    if not tie.size:
        return keep
    # of a tied threshold's rows, k minus those below it (among its unit's k first, which
    # end at the threshold in the sorted values) are kept
    tu, ts = su[tie], s[tie]
    below = np.zeros(tie.size, dtype=np.int64)
    for j in range(1, k):
        q = np.maximum(tie - j, 0)
        below += (tie >= j) & (su[q] == tu) & (s[q] < ts)
    need = np.zeros(thr.size, dtype=np.int64)
    need[tu] = k - below
    rows = np.flatnonzero((comp == at_thr) & np.take(need > 0, hu))
    ru = hu[rows]
    content = [key] + [x for x in (c, v) if x is not None]
    one = np.empty(thr.size, dtype=np.int64)
    one[ru] = rows  # one row of each tied threshold, to compare the others with
    if all(np.array_equal(x[rows], x[one[ru]]) for x in content):
        order = np.argsort(ru)
    else:
        order = np.lexsort(tuple(x[rows] for x in reversed(content)) + (ru,))
    sr = ru[order]
    starts = np.flatnonzero(np.concatenate(([True], sr[1:] != sr[:-1])))
    rank = np.arange(sr.size) - np.repeat(starts, np.diff(np.append(starts, sr.size)))
    keep[rows[order]] = rank < need[sr]
    return keep


def bound_by_content(mask: np.ndarray, units: np.ndarray, n_units: int, k: int, salt: int, ids,
                     codes: np.ndarray | None = None, values: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """Keep at most ``k`` of each unit's rows among ``mask``: the rows with the smallest
    ``row_keys`` (of the unit id, the salt, the row's code and value), ties (equal keys)
    broken by (code, value). ``units`` are dense unit codes of this table (``unit_codes``)
    and ``ids`` the unit column (hashed only for the rows of units over k). The rows kept
    are a function of the unit's own rows' (code, value) multiset and ``salt`` (rows equal
    in both are interchangeable: they add the same to the aggregate), so every
    partitioning of a table keeps the same rows. Returns the new mask and the number of
    rows dropped."""
    heavy = _over_k(mask, units, n_units, k)
    if heavy is None:
        return mask, 0
    hu, hidx = heavy
    if codes is not None or values is not None:
        c = codes[hidx] if codes is not None else None
        v = np.ascontiguousarray(values[hidx], dtype=np.float64) if values is not None else None
        return _apply(mask, hidx, _smallest_k(hu, row_keys(ids, hidx, salt, c, v), c, v, k))
    # Every row of a unit adds the same (one to a count): keep any k; k = 1: one row each,
    # the one whose position survives the scatter (whichever write numpy keeps).
    if k == 1:
        pos = np.arange(len(hu))
        first = np.empty(n_units, dtype=np.int64)
        first[hu] = pos
        keep = first[hu] == pos
    else:
        order = np.argsort(hu)
        keep = np.empty(len(hu), dtype=bool)
        keep[order] = _first_k(hu[order], k)
    return _apply(mask, hidx, keep)


def _apply(mask: np.ndarray, hidx: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, int]:
    """``mask`` without the rows ``hidx[~keep]``, and how many those are."""
    if len(hidx) == len(mask):  # every row was ranked (hidx is then every index, in order)
        return keep, int(len(keep) - np.count_nonzero(keep))
    out = mask.copy()
    out[hidx[~keep]] = False
    return out, int(len(keep) - np.count_nonzero(keep))


def bounded_count(mask: np.ndarray, units: np.ndarray, n_units: int, k: int) -> int:
    """The rows of ``mask`` that ``bound_by_content`` keeps, counted without choosing them:
    sum over units of min(rows, k) (every row of a unit adds one to a count)."""
    u = units if mask.all() else units[mask]
    if u.size == 0:
        return 0
    return int(np.minimum(np.bincount(u, minlength=n_units), k).sum())
