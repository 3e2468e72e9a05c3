"""The resumable work loop (skip what is finished, progress bar, ``errors.jsonl``). Control flow rather
than I/O: it stays importable as ``attnprobe.io.run_resumable`` until an executor replaces it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from attnprobe.errors import AttnprobeError
from attnprobe.io.json import append_jsonl

log = logging.getLogger("attnprobe.io")
T = TypeVar("T")

# Failures a long loop records and moves past (the item is retried on the next run); anything else
# (KeyboardInterrupt, programming errors) stops the loop.
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (AttnprobeError, OSError, RuntimeError, ValueError)


def log_error(errors_path: Path, stage: str, what: dict, exc: BaseException) -> None:
    """One line of ``errors.jsonl``: the stage, what failed, and why (retried on the next run)."""
    append_jsonl(errors_path, {"stage": stage, **what, "error": f"{type(exc).__name__}: {exc}", "time": time.time()})


def progress_bar(**kw):
    """A tqdm bar as every attnprobe loop opens it: not on a terminal, ASCII at position 0, so a log holds
    no escape codes (:func:`attnprobe.io.bars.plain_bar`)."""
    from tqdm.auto import tqdm

    from attnprobe.io.bars import plain_bar

    return tqdm(**{**plain_bar(kw.get("file")), **kw})


class ItemProgress:
    """What ``work`` gets as its second argument when ``run_resumable(..., item_progress=True)``:
    ``advance(n)`` moves the bar as items of the batch finish (the loop adds whatever was not
    advanced when the batch ends), ``note(text)`` shows what is going on now (e.g. "call 7")."""

    def __init__(self, bar) -> None:
        self._bar = bar
        self.advanced = 0

    def advance(self, n: int = 1) -> None:
        self.advanced += n
        self._bar.update(n)

    def note(self, text: str) -> None:
        self._bar.set_postfix_str(text, refresh=True)


def run_resumable(items: Sequence[T], work: Callable[..., None], *, done: Callable[[T], bool],
                  describe: Callable[[T], dict], errors_path: Path, stage: str, desc: str, unit: str = "item",
                  batch_size: int = 1, progress: bool = True,
                  catch: tuple[type[BaseException], ...] = EXPECTED_ERRORS, item_progress: bool = False
                  ) -> dict[str, int]:
    """The one "skip what is finished, work with a progress bar, log failures" loop.

    ``done(item)`` says whether a result already exists; ``work(batch)`` computes and writes the
    results of a batch (it must write each one atomically); a failure in ``catch`` marks every item
    of the batch failed in ``errors_path`` and the loop goes on. Returns
    ``{"done_before", "done", "failed"}``.

    Progress inside a batch: before a batch of several items starts, the bar says "running a batch
    of N" and is redrawn, so a batch generated in one call (IBIS: 12 prompts, one ``generate``) shows
    what it is doing instead of sitting silently at 0/N; the count itself moves when items are
    written. A ``work`` that can tell more takes ``item_progress=True`` and is called as
    ``work(batch, ItemProgress)``, advancing the bar per finished item and noting its current step.
    """
    todo = [it for it in items if not done(it)]
    counts = {"done_before": len(items) - len(todo), "done": 0, "failed": 0}
    if counts["done_before"]:
        log.info("%s: %d of %d already done, skipped", stage, counts["done_before"], len(items))
    size = max(1, batch_size)
    with progress_bar(total=len(todo), desc=desc, unit=unit, disable=not progress) as bar:
        for start in range(0, len(todo), size):
            batch = todo[start:start + size]
            tracker = ItemProgress(bar)
            if len(batch) > 1:
                bar.set_postfix_str(f"running a batch of {len(batch)}", refresh=True)
            try:
                work(batch, tracker) if item_progress else work(batch)
            except catch as exc:
                counts["failed"] += len(batch)
                for it in batch:
                    log_error(errors_path, stage, describe(it), exc)
                log.warning("%s: %s failed: %s: %s", stage, ", ".join(str(describe(it)) for it in batch),
                            type(exc).__name__, exc)
            else:
                counts["done"] += len(batch)
            if getattr(bar, "postfix", None):
                bar.set_postfix_str("", refresh=False)
            bar.update(max(0, len(batch) - tracker.advanced))
    return counts
