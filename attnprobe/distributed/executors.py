"""The one place that chooses an executor: Ray replicas when a cluster is given, else this process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attnprobe.capture.models import ModelSpec
from attnprobe.distributed.cluster import Cluster
from attnprobe.execution.local import LocalExecutor


def refuse_cluster(cluster: Cluster | None, reason: str) -> None:
    """For work that runs no model replicas (generation through an endpoint): a cluster is refused,
    with ``reason``."""
    from attnprobe.errors import AttnprobeError

    if cluster is not None:
        raise AttnprobeError(f"--ray: {reason}")


def open_executor(load: Callable[[], Any], *, cluster: Cluster | None = None, model: ModelSpec | None = None,
                  progress: bool = True):
    """:class:`~attnprobe.distributed.pool.RayExecutor` replicas of ``model`` on ``cluster``, or, without
    a cluster, a :class:`~attnprobe.execution.local.LocalExecutor` that loads with ``load``. Both run
    any job; ``close()`` (or ``with``) releases the model or the replicas."""
    if cluster is None:
        return LocalExecutor(load, progress=progress)
    from attnprobe.distributed.pool import RayExecutor

    return RayExecutor(model or ModelSpec(), cluster=cluster, progress=progress)
