"""A Ray actor that holds one loaded model and runs whatever job it is handed."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from typing import Any

from attnprobe.execution.job import Job, WorkItem, batches, redo_batches


class Replica:
    """One model replica. ``load(spec, backend, dtype, **options)`` happens once, in ``__init__``;
    every job's ``prepare`` result is kept while the job's ``prepare_key`` stays the same."""

    def __init__(self, spec: str, backend: str, dtype: str, load_options: dict, torch_threads: int):
        import torch

        torch.set_num_threads(max(1, int(torch_threads)))
        from attnprobe.capture.models import load_model

        t0 = time.perf_counter()
        self.model, self.load_error = None, None
        self._prepared: tuple[Any, Any] = (None, None)
        try:  # kept, not raised: a failed __init__ reaches the driver only as text, this keeps its type
            self.model = load_model(spec, backend=backend, dtype=dtype, **load_options)
        except Exception as exc:
            self.load_error = exc
        try:
            import ray

            ctx = ray.get_runtime_context()
            node, gpus = ctx.get_node_id(), [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])]
        except Exception:  # outside Ray (unit use): no context
            node, gpus = None, []
        self.info = {"host": socket.gethostname(), "node_id": node, "pid": os.getpid(), "gpus": gpus,
                     "torch_threads": torch.get_num_threads(), "load_seconds": round(time.perf_counter() - t0, 3)}

    def ping(self) -> dict:
        """The replica's description once its model is loaded; raises the load error if it failed."""
        if self.load_error is not None:
            raise self.load_error
        return self.info

    def call(self, fn, *args):
        """``fn(loaded_model, *args)`` here (e.g. a check that needs the tokenizer)."""
        if self.load_error is not None:
            raise self.load_error
        return fn(self.model, *args)

    def run(self, job: Job, shard: Sequence[Sequence[WorkItem]], job_start: float) -> list[dict]:
        """Run one shard (a list of the job's batches); one record per item.

        An item this job already wrote (an earlier attempt of this shard, before its replica died)
        is skipped. A batch that fails with one of ``job.catch`` is redone item by item, so one bad
        item fails alone. Records: ``{"key", "status": written|skipped|failed, "result", "tokens",
        "seconds"}``, or the error's type and text for a failure (only text travels back)."""
        if self.load_error is not None:
            raise self.load_error
        key = job.prepare_key
        if self._prepared[0] != key or self._prepared[1] is None:
            self._prepared = (key, job.prepare(self.model))  # a chat job wraps the model itself (job.needs)
        state = self._prepared[1]
        records: dict[str, dict] = {}
        groups: list[list[WorkItem]] = []
        for batch in shard:
            todo = []
            for it in batch:
                if job.done(it, since=job_start):
                    records[it.key] = {"key": it.key, "status": "skipped"}
                else:
                    todo.append(it)
            groups.extend(batches(todo, len(todo)) if todo else [])

        def run(group: list[WorkItem]) -> tuple[list[Any], float]:
            t0 = time.perf_counter()
            results = job.run(state, group)
            return results, (time.perf_counter() - t0) / len(group)

        for kind, group, value in redo_batches(job, groups, run, since=lambda started: job_start):
            if kind == "written":  # written before its batch failed
                records[group[0].key] = {"key": group[0].key, "status": "skipped"}
            elif kind == "failed":
                records[group[0].key] = {"key": group[0].key, "status": "failed", "error_type": type(value).__name__,
                                         "error": str(value)}
            else:
                results, per = value
                for it, res in zip(group, results):
                    records[it.key] = {"key": it.key, "status": "written", "result": res, "tokens": int(it.tokens),
                                       "seconds": round(per, 4)}
        return [records[it.key] for batch in shard for it in batch]
