"""A job of no study, for the executor tests: item i writes ``<out>/<i>.txt`` with the model's name
and returns ``"i:name"``; item 3 always fails."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from attnprobe.execution.job import JobBase, WorkItem, written_since


@dataclass
class NameJob(JobBase):
    out: Path
    n: int
    batch_size: int = 2
    stage: str = "name"
    collected: list = field(default_factory=list)

    def items(self) -> list[WorkItem]:
        return [WorkItem(key=str(i), tokens=i + 1, describe={"i": i}, data=i) for i in range(self.n + 1)]

    def done(self, item: WorkItem, since: float | None = None) -> bool:
        return written_since(Path(self.out) / f"{item.data}.txt", since)

    def run(self, model, batch) -> list[str]:
        if any(it.data == 3 for it in batch):
            raise ValueError("item 3 is bad")
        Path(self.out).mkdir(parents=True, exist_ok=True)
        for it in batch:
            (Path(self.out) / f"{it.data}.txt").write_text(model.name)
        return [f"{it.data}:{model.name}" for it in batch]

    def collect(self, item: WorkItem, result: str) -> None:
        self.collected.append(result)


@dataclass
class ListJob(JobBase):
    """A job over plain values for the executor tests: ``done(value)`` says which are finished, ``work(job,
    batch)`` runs a batch of values (and may call ``job.note``); the batches it was handed are kept."""

    out: Path
    values: list
    work: object = None
    finished: object = None
    batch_size: int = 1
    stage: str = "demo"
    seen: list = field(default_factory=list)

    def items(self) -> list[WorkItem]:
        return [WorkItem(key=str(v), describe={"item": v}, data=v) for v in self.values]

    def done(self, item: WorkItem, since: float | None = None) -> bool:
        return bool(self.finished and self.finished(item.data))

    def run(self, model, batch) -> list:
        self.seen.append([it.data for it in batch])
        if self.work is not None:
            self.work(self, [it.data for it in batch])
        return [None] * len(batch)
