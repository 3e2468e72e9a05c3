"""Atomic file and folder writes: readers never see half-written results."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: Path, data: bytes) -> None:
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


def append_line_atomic(path: Path, line: str) -> None:
    """Append one full line with a single write + fsync (a crash never leaves half a record)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


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


def iter_jsonl(path: Path, error: Callable[..., Exception]) -> Iterator[tuple[int, Any]]:
    """(line number, parsed record) for every non-blank line of a JSON Lines file.

    ``error(message, path=..., line=...)`` builds the exception for invalid JSON, so each caller
    keeps its own error type while every message names the file and the line.
    """
    text = Path(path).read_text(encoding="utf-8")
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            yield lineno, json.loads(raw)
        except json.JSONDecodeError as exc:
            raise error(f"invalid JSON ({exc.msg} at column {exc.colno})", path=str(path), line=lineno) from None


def located_error(cls: type[Exception]) -> Callable[..., Exception]:
    """An ``error`` factory for :func:`iter_jsonl` for exception types that take one message."""
    return lambda message, path, line: cls(f"{path}, line {line}: {message}")
