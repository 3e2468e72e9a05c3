"""Work balanced over replicas: shards of about a target number of estimated tokens."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

SHARDS_PER_REPLICA = 4  # default shard size: total tokens / (replicas * this)


def make_shards(sizes: Sequence[int], target: int) -> list[list[int]]:
    """Indices grouped into shards of at most ``target`` (first-fit decreasing), largest shard first.

    An item larger than ``target`` is a shard by itself. Within a shard indices keep input order.
    """
    if target < 1:
        raise ValueError("shard target must be >= 1 token")
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        for b, load in enumerate(loads):
            if load + sizes[i] <= target:
                bins[b].append(i)
                loads[b] += sizes[i]
                break
        else:
            bins.append([i])
            loads.append(sizes[i])
    order = sorted(range(len(bins)), key=lambda b: (-loads[b], min(bins[b])))
    return [sorted(bins[b]) for b in order]


def fs_now(folder: Path) -> float:
    """The current time by the clock of the filesystem holding ``folder`` (node clocks may differ)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".job-clock.", dir=folder)
    try:
        return os.fstat(fd).st_mtime
    finally:
        os.close(fd)
        os.unlink(name)
