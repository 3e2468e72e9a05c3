"""What an executor reports for a job, as a command prints it and exits with it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunCounts:
    """Items finished before this run (skipped), finished now, and failed (logged in ``errors.jsonl``,
    retried on the next run). :meth:`of` reads an executor's ``{"done_before", "done", "failed"}``."""

    done_before: int = 0
    done: int = 0
    failed: int = 0

    @classmethod
    def of(cls, counts: Mapping[str, int]) -> RunCounts:
        return cls(int(counts["done_before"]), int(counts["done"]), int(counts["failed"]))

    def line(self, stage: str, *, done: str = "run", to: str | Path | None = None) -> str:
        """The one count line every command prints on stderr: ``"ibis run: 12 decided, 3 already done,
        0 failed -> OUT"`` (``done`` says what finishing an item is; ``to`` where the result is)."""
        text = f"{stage}: {self.done} {done}, {self.done_before} already done, {self.failed} failed"
        return f"{text} -> {to}" if to is not None else text

    @property
    def exit_code(self) -> int:
        """1 when an item failed (the command's output is incomplete; a rerun retries it), else 0."""
        return 1 if self.failed else 0
