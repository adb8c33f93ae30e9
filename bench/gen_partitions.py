"""Generate a partitioned Parquet table for the distributed benchmarks (never committed).

    .venv/bin/python bench/gen_partitions.py --rows 10_000_000 --partitions 8 --out var/bench/parts-10M

Columns: ``pid`` (int64 privacy unit, about rows/4 distinct ids spread uniformly over every
partition; with ``--by-unit`` partition i holds only the ids of its own range, so no
unit's rows span two files, as in a table written sorted or partitioned by unit),
``value`` (float64, normal(50, 25): some outside the benchmark's bounds [0, 100], so
clamping matters; 2% null), ``age`` (int16, 10..99), ``region`` (dictionary string, 8
values, skewed). Partition i is generated from seed (seed, i), so any one can be made
again alone, and a directory already holding the right files (row counts in their footers)
is left as it is. Prints what it wrote, with bytes and seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REGIONS = ["north", "south", "east", "west", "centre", "islands", "abroad", "unknown"]
P_REGIONS = [0.25, 0.2, 0.15, 0.15, 0.1, 0.07, 0.05, 0.03]


def partition(i: int, rows: int, total: int, seed: int, ids: tuple[int, int] | None = None) -> pa.Table:
    """Partition ``i``; ``ids``: the range its unit ids are drawn from (default: all)."""
    rng = np.random.default_rng([seed, i])
    lo, hi = ids or (0, max(total // 4, 1))
    value = rng.normal(50.0, 25.0, rows)
    nulls = rng.random(rows) < 0.02
    region = rng.choice(len(REGIONS), rows, p=P_REGIONS).astype(np.int8)
    return pa.table({
        "pid": rng.integers(lo, max(hi, lo + 1), rows, dtype=np.int64),
        "value": pa.array(value, mask=nulls),
        "age": rng.integers(10, 100, rows, dtype=np.int16),
        "region": pa.DictionaryArray.from_arrays(pa.array(region), pa.array(REGIONS)),
    })


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=lambda s: int(s.replace("_", "")), required=True, help="total rows")
    ap.add_argument("--partitions", type=int, required=True, help="number of Parquet files")
    ap.add_argument("--out", type=Path, required=True, help="directory to write (under var/ or /tmp)")
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--row-group", type=int, default=1_000_000, help="rows per Parquet row group")
    ap.add_argument("--by-unit", action="store_true",
                    help="each partition holds its own range of unit ids (no unit spans two files)")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, a.rows, a.partitions + 1).astype(np.int64)
    t0, written, kept, size = time.perf_counter(), 0, 0, 0
    # a file is kept only if written with these arguments (a --by-unit run into a directory
    # first written without it kept the old files, units spread over every file)
    made_with = json.dumps({"rows": a.rows, "partitions": a.partitions, "seed": a.seed, "row_group": a.row_group,
                            "by_unit": a.by_unit}, sort_keys=True).encode()
    for i in range(a.partitions):
        path = a.out / f"part-{i:05d}.parquet"
        rows = int(bounds[i + 1] - bounds[i])
        if path.exists():
            try:
                meta = pq.ParquetFile(path).metadata
                if meta.num_rows == rows and (meta.metadata or {}).get(b"gen_partitions") == made_with:
                    kept += 1
                    size += path.stat().st_size
                    continue
            except (OSError, pa.ArrowException):
                pass
        tmp = path.with_suffix(".tmp")
        units = max(a.rows // 4, 1)
        ids = (units * i // a.partitions, units * (i + 1) // a.partitions) if a.by_unit else None
        table = partition(i, rows, a.rows, a.seed, ids)
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"gen_partitions": made_with})
        pq.write_table(table, tmp, row_group_size=a.row_group)
        tmp.replace(path)
        written += 1
        size += path.stat().st_size
        print(f"  {path.name}: {rows:,} rows", file=sys.stderr, flush=True)
    print(f"{a.out}: {a.rows:,} rows in {a.partitions} partitions ({written} written, {kept} kept), "
          f"{size / 1e9:.2f} GB, {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
