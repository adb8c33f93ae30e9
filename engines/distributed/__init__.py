"""Distributed execution of the engines on Dask (``dask``, ``distributed``); no Django.

A dataset whose execution mode is ``distributed`` is a set of Parquet partitions (local
paths or URIs pyarrow's filesystems read: ``s3://``, ``gs://``, ``hdfs://``). The worker
that runs a request does not read its rows: it hands the engine a ``PartitionedTable``
(``source``), and an engine that declares ``"distributed": True`` in ``engine_info`` sends
the exact-aggregate work to the Dask cluster (``cluster``) and adds the noise itself,
once, to the combined exact aggregate. Other engines get the partitions read into one
``pyarrow.Table`` (``engines.plugins.run``), as for a local dataset.

Modules: ``source`` (partitions, their manifest and its check: footers only, no rows),
``cluster`` (the Dask client and running a graph with retries and progress),
``cluster.by_unit`` (a unit's rows brought together without a shuffle: pure in-memory
tasks deal each file's rows into unit buckets), ``aggregates`` (the aggregates engine's
exact parts per partition, or per unit bucket when there is a privacy unit), ``profile`` (counts a registration needs),
``synthesis`` (MST's marginals as distributed group-by counts).
"""

from .source import PartitionError, PartitionedTable

__all__ = ["PartitionError", "PartitionedTable"]
