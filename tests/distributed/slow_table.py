"""A partitioned table whose files take a while each to read (a rank can be killed while it
reads), in a module of its own: the Dask workers unpickle it by importing this module,
which must import nothing but the engine (a test module's imports took the workers down)."""

import dataclasses
import time

from engines.distributed import PartitionedTable


@dataclasses.dataclass(frozen=True)
class SlowTable(PartitionedTable):
    delay: float = 0.0

    def read_file(self, path):
        time.sleep(self.delay)
        return super().read_file(path)
