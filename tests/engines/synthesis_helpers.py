"""One synthesis run through the plugin API (plan, then run), as a worker does it."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa

from engines import plugins
from engines.types import DatasetMeta, EngineRequest


def synthesize(df: pd.DataFrame, meta: DatasetMeta, params: dict, progress=lambda p: None):
    """(the synthetic table, the plan, the release) of a ``synthesize`` request on ``df``."""
    request = EngineRequest("synthesize", params)
    plan = plugins.plan("synthesis", request, meta)
    with tempfile.TemporaryDirectory() as out:
        release = plugins.run("synthesis", request, meta, pa.Table.from_pandas(df, preserve_index=False), plan,
                              progress, workdir=out)
        return pd.read_parquet(Path(out) / "synthetic.parquet"), plan, release
