"""Facts about one Arrow column that the engines and dataset registration both need."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def null_count(col: pa.Array | pa.ChunkedArray) -> int:
    """Nulls in ``col`` and, in a floating-point column, NaN too (neither is a value a
    declaration ``nullable: false`` allows)."""
    nan = int(pc.sum(pc.is_nan(col)).as_py() or 0) if pa.types.is_floating(col.type) else 0
    return col.null_count + nan
