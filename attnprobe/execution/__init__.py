"""Running a study: every study is a :class:`~attnprobe.execution.job.Job`, and an executor runs any job.

- :mod:`~attnprobe.execution.job`: the seam (work items with a cost, ``done``, ``run`` on a batch);
- :mod:`~attnprobe.execution.local`: this process (skip finished, progress, ``errors.jsonl``, batches
  then singles);
- :mod:`~attnprobe.execution.counts`: :class:`RunCounts`, the count line and exit code every command reports;
- :mod:`attnprobe.distributed`: the same on Ray model replicas (extra ``[ray]``), and
  :func:`attnprobe.distributed.open_executor`, the one place that chooses between the two.

Nothing here imports a study: a study defines its job beside its code and hands it to an executor.
"""

from attnprobe.execution.counts import RunCounts
from attnprobe.execution.job import Job, WorkItem, batches
from attnprobe.execution.local import LocalExecutor

__all__ = ["Job", "LocalExecutor", "RunCounts", "WorkItem", "batches"]
