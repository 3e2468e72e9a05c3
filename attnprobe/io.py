"""Every file the project writes or reads back goes through here: atomic writes, the one JSON Lines
reader, the one appender, and the one resumable work loop.

JSON Lines rules (one place, so every file behaves the same):

- records are split on ``\\n`` only. JSON allows U+2028, U+0085, form feeds ... raw inside strings,
  and our own writers emit them raw (``ensure_ascii=False``); ``str.splitlines`` would break there.
- a *torn tail* (a last line with no newline that does not parse: a crash mid-append) is handled
  by an explicit policy: ``"error"`` for inputs a person wrote, ``"skip"`` for files we append to
  (reported through :mod:`logging`, never silently). Invalid JSON anywhere else is always an error
  naming file and line.
- :func:`append_jsonl` repairs a torn tail (truncates it away, keeping a ``.torn`` backup) before
  appending, writes every byte (short writes are retried) and fsyncs, so a record either exists
  whole or not at all.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from attnprobe.errors import AttnprobeError

log = logging.getLogger(__name__)
T = TypeVar("T")

# Failures a long loop records and moves past (the item is retried on the next run); anything else
# (KeyboardInterrupt, programming errors) stops the loop.
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (AttnprobeError, OSError, RuntimeError, ValueError)


# ------------------------------------------------------------------------------- atomic writes
def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write under a temporary name, fsync, rename into place (readers never see half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_jsonl(path: Path, records: Iterable[Any]) -> None:
    """Replace a JSON Lines file atomically with ``records``."""
    atomic_write_text(path, "".join(dumps_line(r) for r in records))


class AtomicDir:
    """Build a folder under a temporary name and rename it into place on success."""

    def __init__(self, target: Path):
        self.target = Path(target)
        self.tmp: Path | None = None

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.", dir=self.target.parent))
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        assert self.tmp is not None
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        os.chmod(self.tmp, 0o755)  # mkdtemp creates 0700
        if self.target.exists():
            old = self.target.with_name(f".{self.target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(self.target, old)
            os.replace(self.tmp, self.target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(self.tmp, self.target)
        return False


def safe_name(identifier: str) -> str:
    """A folder name for any trajectory id: readable, filesystem-safe and collision-free."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", identifier.replace("/", "__")).strip("._")[:80] or "item"
    if readable == identifier:
        return readable
    return f"{readable}-{hashlib.sha1(identifier.encode()).hexdigest()[:8]}"


# ------------------------------------------------------------------------------- JSON Lines
def dumps_line(record: Any) -> str:
    """One JSON Lines record (UTF-8 kept readable; ``\\n`` inside strings is escaped by json)."""
    return json.dumps(record, ensure_ascii=False) + "\n"


def _default_error(message: str, path: str, line: int | None) -> Exception:
    return AttnprobeError(f"{path}, line {line}: {message}" if line is not None else f"{path}: {message}")


def read_jsonl(path: Path, *, error: Callable[..., Exception] | None = None, torn_tail: str = "error",
               missing_ok: bool = False) -> Iterator[tuple[int, Any]]:
    """(line number, parsed record) for every non-blank line of a JSON Lines file.

    ``error(message, path=..., line=...)`` builds the exception (each caller keeps its own error
    type; every message names the file and line). ``torn_tail``: ``"error"`` or ``"skip"`` (see the
    module docstring). ``missing_ok``: a missing file reads as empty (files we have not written yet).
    """
    if torn_tail not in ("error", "skip"):
        raise ValueError("torn_tail must be 'error' or 'skip'")
    make = error or _default_error
    path = Path(path)
    if missing_ok and not path.exists():
        return
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise make("is a folder, not a JSON Lines file", path=str(path), line=None) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise make(f"not UTF-8 text (byte {exc.start})", path=str(path), line=line) from None
    lines = text.split("\n")
    last = len(lines) if lines[-1] else len(lines) - 1  # index of the last real line (1-based)
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            yield lineno, json.loads(raw)
        except json.JSONDecodeError as exc:
            torn = lineno == last and not text.endswith("\n")
            if torn and torn_tail == "skip":
                log.warning("%s, line %d: ignoring a torn last line (%d bytes, no newline): an interrupted write",
                            path, lineno, len(raw.encode("utf-8")))
                continue
            raise make(f"invalid JSON ({exc.msg} at column {exc.colno})", path=str(path), line=lineno) from None
        except RecursionError:
            raise make("JSON nested too deeply", path=str(path), line=lineno) from None


def read_records(path: Path, **kwargs) -> list[Any]:
    """The records of :func:`read_jsonl` as a list (line numbers dropped)."""
    return [rec for _, rec in read_jsonl(path, **kwargs)]


def located_error(cls: type[Exception]) -> Callable[..., Exception]:
    """An ``error`` factory for :func:`read_jsonl` for exception types that take one message."""
    return lambda message, path, line: cls(f"{path}, line {line}: {message}" if line is not None
                                           else f"{path}: {message}")


def repair_torn_tail(path: Path) -> int:
    """Cut a last line that has no newline (an interrupted append) off ``path``; returns bytes removed.

    The cut bytes are kept in ``<path>.torn`` (appended) and the repair is logged.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb+") as fh:
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return 0
        block = 1 << 16
        pos = size
        cut = 0
        while pos > 0:  # find the last newline from the end
            start = max(0, pos - block)
            fh.seek(start)
            chunk = fh.read(pos - start)
            i = chunk.rfind(b"\n")
            if i >= 0:
                cut = start + i + 1
                break
            pos = start
        fh.seek(cut)
        fragment = fh.read()
        with open(path.with_name(path.name + ".torn"), "ab") as bak:
            bak.write(fragment + b"\n")
        fh.truncate(cut)
        fh.flush()
        os.fsync(fh.fileno())
    log.warning("%s: removed a torn last line of %d bytes (an interrupted write; kept in %s.torn)",
                path, len(fragment), path.name)
    return len(fragment)


def append_jsonl(path: Path, record: Any) -> None:
    """Append one record durably: torn tail repaired first, every byte written, fsync."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    repair_torn_tail(path)
    data = dumps_line(record).encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------- resumable loop
def log_error(errors_path: Path, stage: str, what: dict, exc: BaseException) -> None:
    """One line of ``errors.jsonl``: the stage, what failed, and why (retried on the next run)."""
    append_jsonl(errors_path, {"stage": stage, **what, "error": f"{type(exc).__name__}: {exc}", "time": time.time()})


def run_resumable(items: Sequence[T], work: Callable[[list[T]], None], *, done: Callable[[T], bool],
                  describe: Callable[[T], dict], errors_path: Path, stage: str, desc: str, unit: str = "item",
                  batch_size: int = 1, progress: bool = True,
                  catch: tuple[type[BaseException], ...] = EXPECTED_ERRORS) -> dict[str, int]:
    """The one "skip what is finished, work with a progress bar, log failures" loop.

    ``done(item)`` says whether a result already exists; ``work(batch)`` computes and writes the
    results of a batch (it must write each one atomically); a failure in ``catch`` marks every item
    of the batch failed in ``errors_path`` and the loop goes on. Returns
    ``{"done_before", "done", "failed"}``.
    """
    from tqdm.auto import tqdm

    todo = [it for it in items if not done(it)]
    counts = {"done_before": len(items) - len(todo), "done": 0, "failed": 0}
    if counts["done_before"]:
        log.info("%s: %d of %d already done, skipped", stage, counts["done_before"], len(items))
    with tqdm(total=len(todo), desc=desc, unit=unit, disable=not progress) as bar:
        for start in range(0, len(todo), max(1, batch_size)):
            batch = todo[start:start + max(1, batch_size)]
            try:
                work(batch)
            except catch as exc:
                counts["failed"] += len(batch)
                for it in batch:
                    log_error(errors_path, stage, describe(it), exc)
                log.warning("%s: %s failed: %s: %s", stage, ", ".join(str(describe(it)) for it in batch),
                            type(exc).__name__, exc)
            else:
                counts["done"] += len(batch)
            bar.update(len(batch))
    return counts
