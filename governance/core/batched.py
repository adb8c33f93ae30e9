"""``batched``: itertools.batched of Python 3.12, for 3.11."""

from __future__ import annotations

from collections.abc import Iterable, Iterator


def batched(items: Iterable, n: int) -> Iterator[list]:
    """Lists of ``n`` of ``items`` in order (the last one may be shorter)."""
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch
