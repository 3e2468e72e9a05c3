"""The seam between a study and the executors that run it.

A job is a list of :class:`WorkItem` plus three questions an executor asks without knowing the
study: is this item finished (``done``), what does a loaded model become for this job
(``prepare``), and run this batch (``run``, which writes every result atomically itself). ``needs`` says
what ``prepare`` turns the executor's model into: ``"model"`` (the loaded model, as is) or ``"chat"`` (a chat
backend, made with ``chat_options`` by the one factory :func:`attnprobe.generation.factory.chat_for`, which
:class:`attnprobe.generation.factory.ChatJob` calls); the executors never import the generation layer. Results a
job returns instead of writing (IBIS decisions, appended to one file) go back to the process that
started the job and are handed to ``collect`` there, so such a file has one writer.

Items carry plain data (ids, dicts, trajectories): Ray ships them to replicas. A job object holds
settings only, so shipping it to every replica is cheap.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from attnprobe.io import EXPECTED_ERRORS


@dataclass(frozen=True)
class WorkItem:
    """One unit of work. ``key``: unique within the job; ``tokens``: estimated cost (Ray balances
    shards by it; no tokenizer needed); ``describe``: what ``errors.jsonl`` says failed; ``data``:
    what ``run`` needs; ``group``: items with the same group always run in one batch (they share
    work, e.g. the steps of one trajectory share its prefill), and a group counts as one toward the
    job's ``batch_size``."""

    key: str
    tokens: int = 1
    describe: dict = field(default_factory=dict)
    data: Any = None
    group: str | None = None


@runtime_checkable
class Job(Protocol):
    """What every study provides (see the module docstring). Attributes:

    ``stage`` (names the stage in logs and errors.jsonl), ``unit`` (progress unit), ``out`` (the
    job's folder: ``errors.jsonl`` and, on Ray, ``distributed.json`` go there), ``batch_size`` (items
    per ``run`` call; a failed batch is redone item by item), ``force`` (redo finished items),
    ``catch`` (exceptions that fail an item instead of the job), ``needs`` ("model" or "chat": what
    ``prepare`` makes of the executor's model), ``chat_options`` (for "chat": how a loaded model is wrapped,
    e.g. ``{"stop_at_call": False}``).
    """

    stage: str
    unit: str
    out: Path
    batch_size: int
    force: bool
    catch: tuple[type[BaseException], ...]
    needs: str
    chat_options: dict

    def items(self) -> list[WorkItem]: ...

    def done(self, item: WorkItem, since: float | None = None) -> bool:
        """Finished with this job's settings; with ``since``, also written at or after that time (by
        the filesystem's clock): a retried Ray shard skips what an earlier attempt of this job wrote."""

    def prepare(self, model: Any) -> Any:
        """What ``run`` works with, made once per loaded model (e.g. a chat wrapper); usually the model."""

    def run(self, state: Any, batch: Sequence[WorkItem]) -> list[Any]:
        """Compute and write the batch's results atomically; one value per item for :meth:`collect`."""

    def collect(self, item: WorkItem, result: Any) -> None:
        """Called where the job was started with what ``run`` returned for ``item`` (default: nothing)."""

    def finish(self) -> list[str]:
        """Called where the job was started once every write has ended: remove what an interrupted
        writer left half-built (work folders); returns what it removed."""

    @property
    def prepare_key(self) -> Any:
        """Replicas reuse ``prepare``'s result while this stays the same."""


class JobBase:
    """Defaults for the optional parts of :class:`Job`, and :meth:`note` for progress inside a batch."""

    unit = "item"
    batch_size = 1
    force = False
    catch: tuple[type[BaseException], ...] = EXPECTED_ERRORS
    needs = "model"  # a chat job derives from attnprobe.generation.factory.ChatJob (needs = "chat")
    chat_options: dict = {}  # read only (a class attribute shared by every job)
    _note = None  # set by an executor that shows progress
    _advance = None  # set by an executor whose bar counts the job's units (see ``bar_units``)
    # Optional: ``bar_units(item) -> int``, an upper bound of the item's units of progress (``bar_unit``, e.g. a
    # study episode's model calls), so the local executor's bar counts units as the job reports them
    # (:meth:`advance`) rather than finished items only; an item that ends below its bound drops the rest.
    bar_units = None
    bar_unit = "unit"

    def note(self, text: str) -> None:
        """What the running batch is doing now (e.g. "token 320/4096, 9/12 rows stopped"): shown beside
        the progress bar of the local executor; nothing elsewhere."""
        if self._note is not None:
            self._note(text)

    def advance(self, key: str, n: int = 1) -> None:
        """``n`` more units of item ``key`` are done (jobs with ``bar_units``): the local executor's bar moves;
        nothing elsewhere."""
        if self._advance is not None:
            self._advance(key, n)

    def prepare(self, model: Any) -> Any:
        return model

    def collect(self, item: WorkItem, result: Any) -> None:
        return None

    def finish(self) -> list[str]:
        return []

    @property
    def prepare_key(self) -> Any:
        """Replicas reuse ``prepare``'s result while this stays the same."""
        return type(self).__name__


def batches(todo: Sequence[WorkItem], size: int) -> list[list[WorkItem]]:
    """The batches every executor runs: the unfinished items in order, ``size`` units at a time, where a
    unit is one item, or all items of one ``group`` (gathered at the group's first item). Both
    executors cut them the same way, so results that depend on the batch (captures that share a
    prefill) are the same bit for bit."""
    size = max(1, int(size))
    units: list[list[WorkItem]] = []
    where: dict[str, int] = {}
    for it in todo:
        if it.group is None:
            units.append([it])
        elif it.group in where:
            units[where[it.group]].append(it)
        else:
            where[it.group] = len(units)
            units.append([it])
    return [[it for u in units[i:i + size] for it in u] for i in range(0, len(units), size)]


CLOCK_SLACK = 0.05  # file times come from the kernel's coarse clock, a few ms behind time.time()


def redo_batches(job: Job, groups: Sequence[Sequence[WorkItem]], run: Callable[[list[WorkItem]], Any], *,
                 since: Callable[[float], float | None],
                 on_split: Callable[[list[WorkItem], BaseException], None] | None = None,
                 ) -> Iterator[tuple[str, list[WorkItem], Any]]:
    """The one batch-and-redo loop of every executor: ``run(batch)`` each batch in order, and yield
    ``("ran", batch, value)``; a batch of several that fails with one of ``job.catch`` is redone item by item
    (``on_split(batch, exc)`` first), so one bad item fails alone: ``("failed", [item], exc)``. An item of a
    failed batch that the batch wrote before it failed is not run again: ``("written", [item], None)``, when
    ``job.done(item, since=since(started))`` holds, ``started`` being when its batch began (by the file clock)."""
    groups = [list(g) for g in groups]
    redo: dict[str, float | None] = {}  # item of a failed batch -> the ``since`` its done check takes
    while groups:
        batch = groups.pop(0)
        if batch[0].key in redo and job.done(batch[0], since=redo.pop(batch[0].key)):
            yield "written", batch, None
            continue
        started = time.time() - CLOCK_SLACK
        try:
            value = run(batch)
        except job.catch as exc:
            if len(batch) > 1:
                if on_split is not None:
                    on_split(batch, exc)
                groups[:0] = [[it] for it in batch]
                redo.update({it.key: since(started) for it in batch})
                continue
            yield "failed", batch, exc
            continue
        yield "ran", batch, value


def written_since(path: Path, since: float | None) -> bool:
    """Whether ``path`` exists and (with ``since``) was modified at or after ``since``."""
    try:
        mtime = Path(path).stat().st_mtime
    except OSError:
        return False
    return since is None or mtime >= since
