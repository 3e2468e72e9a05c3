"""The Ray executor: any :class:`~attnprobe.execution.job.Job` on model replicas (extra ``[ray]``).

Why Ray: vLLM already uses it for multi-node execution, so a cluster that runs vLLM runs this too,
and attnprobe does not grow a scheduler of its own. What stays the same as a run in one process:
every result is written by the replica that computed it, through the job's own ``run`` (atomic
writes), into the same folders; "done" is decided on the driver by the job's ``done``; what a job
returns instead of writing is collected on the driver (one writer per file); failures go to
``errors.jsonl``, written by the driver only. The output path must be shared by every node.

- :mod:`.cluster`: where to run (``Cluster``) and how to join it;
- :mod:`.shards`: work balanced by estimated tokens;
- :mod:`.replica`: a Ray actor that loads the model once and runs whatever job it is handed;
- :mod:`.pool`: the replicas, scheduling with requeue on a lost replica, and :class:`RayExecutor`;
- :mod:`.executors`: :func:`open_executor`, the one place that picks the local or the Ray executor.

This package imports no study: a new study runs here with no edit in it.
"""

from attnprobe.distributed.cluster import Cluster, check_address, connect
from attnprobe.distributed.executors import open_executor
from attnprobe.distributed.pool import RUN_FILE, RayExecutor
from attnprobe.distributed.replica import Replica
from attnprobe.distributed.shards import fs_now, make_shards

__all__ = ["RUN_FILE", "Cluster", "RayExecutor", "Replica", "check_address",
           "connect", "fs_now", "make_shards", "open_executor"]
