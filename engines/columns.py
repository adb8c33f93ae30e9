"""Facts about one Arrow column that the engines and dataset registration both need."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def null_count(col: pa.Array | pa.ChunkedArray) -> int:
    """Nulls in ``col`` and, in a floating-point column, NaN too (neither is a value a
    declaration ``nullable: false`` allows)."""
    nan = int(pc.sum(pc.is_nan(col)).as_py() or 0) if pa.types.is_floating(col.type) else 0
    return col.null_count + nan


def unit_ids(col: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A privacy-unit column as its ids compare: an extension type (a Parquet UUID, say) by
    its storage, a dictionary by its values, and a float's -0.0 as 0.0. Arrow's kernels
    (``value_counts``, ``dictionary_encode``) compare floats by their bits, where SQL, the
    predicates and pandas hold -0.0 == 0.0: read as two ids, one person counted as two
    units and gave a unit-level count twice its bound's rows."""
    if isinstance(col.type, pa.BaseExtensionType):
        col = (pa.chunked_array([c.storage for c in col.chunks], col.type.storage_type)
               if isinstance(col, pa.ChunkedArray) else col.storage)
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    if pa.types.is_floating(col.type):
        col = pc.add(col.cast(pa.float64()), 0.0)  # -0.0 + 0.0 is 0.0
    return col
