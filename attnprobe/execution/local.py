"""The local executor: run a job in this process."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from attnprobe.execution.job import Job, WorkItem, batches, redo_batches
from attnprobe.io import ERRORS_FILE, log_error

log = logging.getLogger(__name__)


class LocalExecutor:
    """Runs any :class:`~attnprobe.execution.job.Job` here: skips finished items, shows progress,
    logs failures to ``<job.out>/errors.jsonl`` and goes on; a batch that fails is redone item by
    item so one bad item fails alone. The model is loaded by ``load()`` on first need only (a
    rerun with nothing left loads nothing) and kept for every later job of this executor."""

    shards = False  # one process: callers may hand it work in small groups

    def __init__(self, load: Callable[[], Any], *, progress: bool = True):
        self._load = load
        self._model: Any = None
        self._loaded = False
        self.progress = progress

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._model, self._loaded = None, False

    @property
    def model(self) -> Any:
        if not self._loaded:
            self._model, self._loaded = self._load(), True
        return self._model

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(model, *args)`` where the model lives (here); e.g. a check that needs the tokenizer."""
        return fn(self.model, *args)

    def run(self, job: Job) -> dict[str, int]:
        """Run the job's unfinished items; returns ``{"done_before", "done", "failed"}``."""
        items = job.items()
        todo = list(items) if job.force else [it for it in items if not job.done(it)]
        counts = {"done_before": len(items) - len(todo), "done": 0, "failed": 0}
        if counts["done_before"]:
            log.info("%s: %d of %d already done, skipped", job.stage, counts["done_before"], len(items))
        if not todo:
            job.finish()
            return counts
        state = job.prepare(self.model)
        with _Progress(job, todo, self.progress) as bar:
            def run(batch: list[WorkItem]) -> list[Any]:
                if len(batch) > 1:
                    bar.set_postfix_str(f"running a batch of {len(batch)}", refresh=True)
                if hasattr(job, "_note"):
                    job._note = lambda text: bar.set_postfix_str(text, refresh=True)
                try:
                    return job.run(state, batch)
                finally:
                    if hasattr(job, "_note"):
                        job._note = None
                    if getattr(bar, "postfix", None):
                        bar.set_postfix_str("", refresh=False)

            def split(batch: list[WorkItem], exc: BaseException) -> None:
                log.warning("%s: a batch of %d failed (%s: %s); redoing it item by item", job.stage, len(batch),
                            type(exc).__name__, exc)

            # an item a failed batch wrote before it failed is not run again: without --force any result now
            # there is new; with it, only one written since the batch started
            for kind, batch, value in redo_batches(job, batches(todo, job.batch_size), run, on_split=split,
                                                   since=lambda started: started if job.force else None):
                if kind == "failed":
                    self._failed(job, batch[0], value)
                    counts["failed"] += 1
                else:
                    for it, res in zip(batch, value or ()):
                        job.collect(it, res)
                    counts["done"] += len(batch)
                bar.ended(batch)
        job.finish()
        return counts

    @staticmethod
    def _failed(job: Job, item: WorkItem, exc: BaseException) -> None:
        log_error(job.out / ERRORS_FILE, job.stage, item.describe or {"key": item.key}, exc)
        log.warning("%s: %s failed: %s: %s", job.stage, item.describe or item.key, type(exc).__name__, exc)


class _Progress:
    """The local executor's bar. By items (one step per finished item), or, for a job with ``bar_units``
    (:class:`~attnprobe.execution.job.JobBase`), by those units: the total is every unfinished item's bound,
    :meth:`JobBase.advance` moves the bar as units are done (never past an item's bound), and an item that
    ends drops its unused units from the total, so a study of few long episodes shows its model calls
    rather than 0% until an episode ends. The description counts the items ended ("interference 3/12 runs")."""

    def __init__(self, job: Job, todo: list[WorkItem], show: bool):
        from attnprobe.io import progress_bar

        self.job, self.items = job, len(todo)
        units = getattr(job, "bar_units", None)
        self.bound = {it.key: max(1, int(units(it))) for it in todo} if callable(units) else None
        self.got: dict[str, int] = {}
        self.ended_items = 0
        unit = getattr(job, "bar_unit", job.unit) if self.bound else job.unit
        total = sum(self.bound.values()) if self.bound else len(todo)
        self.bar = progress_bar(total=total, desc=self._desc(), unit=unit, disable=not show)

    def _desc(self) -> str:
        return f"{self.job.stage} {self.ended_items}/{self.items} {self.job.unit}s" if self.bound else self.job.stage

    def __enter__(self):
        self.bar.__enter__()
        if self.bound:
            self.job._advance = self.advance
        return self

    def __exit__(self, *exc):
        if self.bound:
            self.job._advance = None
        return self.bar.__exit__(*exc)

    def __getattr__(self, name):  # set_postfix_str, postfix, ...: the bar's
        return getattr(self.bar, name)

    def advance(self, key: str, n: int = 1) -> None:
        if key not in self.bound:
            return
        n = max(0, min(n, self.bound[key] - self.got.get(key, 0)))
        if n:
            self.got[key] = self.got.get(key, 0) + n
            self.bar.update(n)

    def ended(self, batch: list[WorkItem]) -> None:
        """These items are finished (done or failed)."""
        self.ended_items += len(batch)
        if not self.bound:
            self.bar.update(len(batch))
            return
        for it in batch:
            rest = self.bound.get(it.key, 0) - self.got.get(it.key, 0)
            self.got[it.key] = self.bound.get(it.key, 0)
            if rest > 0:
                self.bar.total -= rest
        self.bar.set_description(self._desc(), refresh=False)
        self.bar.refresh()


def in_process(loaded: Any, *, progress: bool = False) -> LocalExecutor:
    """The executor for a model (or chat) a Python caller already loaded in this process: the API entry
    points that take one (``run_questions(chat, ...)``, ``run_behaviour(backend, ...)``) run their study on
    it, so no study module builds an executor itself (the CLI's executors: :mod:`attnprobe.cli.adapter`)."""
    return LocalExecutor(lambda: loaded, progress=progress)
