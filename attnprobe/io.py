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

import contextlib
import errno
import functools
import hashlib
import json
import logging
import math
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
@contextlib.contextmanager
def _naming(path: Path):
    """Give an OSError raised without a file name (a failed write or fsync: disk full) the name of the
    file being written, so the one-line error says where."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(path)) from None
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write under a temporary name, fsync, rename into place (readers never see half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with _naming(path), os.fdopen(fd, "wb") as fh:
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


# Hidden working names of AtomicDir next to its target: ".<name>.tmp-<random>" (being built) and
# ".<name>.old-<random>" (the previous version, between the two renames of a replacement). Older
# versions used ".<name>.<8 random chars>" and ".<name>.old"; those are recognised too.
_WORK_DIR = re.compile(r"^\.(?P<name>.+)\.(?:(?P<kind>tmp|old)-[A-Za-z0-9_]+|(?P<legacy_old>old)|[a-z0-9_]{8})$")
RENAME_EXCHANGE = 2  # linux/fs.h


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    rc = fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), ctypes.c_uint(RENAME_EXCHANGE))
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
        return False  # this filesystem or kernel cannot exchange: fall back to two renames
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def is_work_dir(name: str) -> bool:
    """True for names that no reader may treat as a result: dot-folders (AtomicDir's working copies,
    ``.git``, editor caches)."""
    return name.startswith(".")


def recover_atomic_dirs(parent: Path) -> list[str]:
    """Clean up after an AtomicDir that was killed: returns what was done (each also logged).

    A target that is missing while its previous version waits under ``.<name>.old-*`` (killed between
    the two renames of a replacement) gets that version back, so a result is never lost; every other
    working folder (a half-built ``.tmp-``, an old copy whose replacement is in place) is deleted.
    Call it only where no other process is writing into ``parent`` at the same time.
    """
    parent = Path(parent)
    done: list[str] = []
    try:
        entries = sorted(parent.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return done
    for entry in entries:
        m = _WORK_DIR.match(entry.name)
        if not m or not entry.is_dir() or entry.is_symlink():
            continue
        target = parent / m.group("name")
        is_old = m.group("kind") == "old" or m.group("legacy_old") is not None
        if is_old and not target.exists():
            os.replace(entry, target)
            done.append(f"restored {target.name} from {entry.name} (a replacement was interrupted)")
        else:
            shutil.rmtree(entry, ignore_errors=True)
            done.append(f"removed {entry.name} (left by an interrupted write)")
    for line in done:
        log.warning("%s: %s", parent, line)
    return done


class AtomicDir:
    """Build a folder under a temporary name and move it into place on success.

    Replacing an existing folder never leaves it missing: on Linux the two folders are exchanged
    atomically (renameat2), elsewhere the old one is renamed away first and restored by
    :func:`recover_atomic_dirs` if the process dies before the new one is in place. Files are fsynced
    and made world-readable (0644; folders 0755) before the move.
    """

    def __init__(self, target: Path):
        self.target = Path(target)
        self.tmp: Path | None = None

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.tmp-", dir=self.target.parent))
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        assert self.tmp is not None
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
                raise OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(self.target)) from None
            return False
        try:
            self._publish(self.tmp)
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        return False

    def _publish(self, tmp: Path) -> None:
        for f in tmp.iterdir():
            if f.is_file():
                os.chmod(f, 0o644)
                with _naming(self.target / f.name), open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        os.chmod(tmp, 0o755)  # mkdtemp creates 0700
        _fsync_dir(tmp)
        target = self.target
        if target.exists() and _exchange(tmp, target):
            shutil.rmtree(tmp, ignore_errors=True)  # now holds the previous version
        elif target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, old)  # (a folder may replace an empty folder)
            os.replace(tmp, target)  # killed between these two: recover_atomic_dirs restores `old`
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
        _fsync_dir(target.parent)


def ensure_writable_dir(folder: Path, what: str = "output folder") -> Path:
    """Create ``folder`` if needed and prove a file can be written there, before any heavy work.

    Raises AttnprobeError naming the folder (read-only, permission denied, a file in the way, disk full).
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise AttnprobeError(f"{folder}: the {what} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".attnprobe-write-test.", dir=folder)
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise AttnprobeError(f"{folder}: the {what} is not writable ({exc.strerror or exc})") from None
    return folder


def ensure_writable_file(path: Path, what: str = "output file") -> Path:
    """Check that ``path`` can be (re)written atomically: not a folder, its folder writable."""
    path = Path(path)
    if path.is_dir():
        raise AttnprobeError(f"{path}: the {what} is a folder")
    ensure_writable_dir(path.parent, f"folder of the {what}")
    return path


def safe_name(identifier: str) -> str:
    """A folder name for any trajectory id: readable, filesystem-safe and collision-free."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", identifier.replace("/", "__")).strip("._")[:80] or "item"
    if readable == identifier:
        return readable
    return f"{readable}-{hashlib.sha1(identifier.encode()).hexdigest()[:8]}"


FINGERPRINT_SAMPLE = 64 * 1024  # bytes read at the start, middle and end of a large file


@functools.lru_cache(maxsize=256)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:  # keyed on size and mtime: edits recompute
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as fh:
        if size <= 16 * FINGERPRINT_SAMPLE:
            h.update(fh.read())
        else:
            for pos in (0, size // 2, size - FINGERPRINT_SAMPLE):
                fh.seek(pos)
                h.update(fh.read(FINGERPRINT_SAMPLE))
    return h.hexdigest()


def fingerprint(path: Path) -> str:
    """A cheap content fingerprint (16 hex digits) of a file, or of the visible files of a folder.

    Small files (up to 1 MiB: configs, tokenizers) are hashed whole; larger ones (weights) by their
    size and three 64 KiB samples (start, middle, end), so a multi-GB model costs 192 KiB of reads per
    file. Different weights (another quantisation, a fine-tune, a truncated copy) change it; copying or
    touching the files does not (no names of the file itself, no mtimes). Folders add each file's name.
    """
    path = Path(path)
    if path.is_file():
        st = path.stat()
        return _file_digest(str(path.resolve()), st.st_size, st.st_mtime_ns)[:16]
    h = hashlib.sha256()
    for f in sorted(path.iterdir()):
        if f.name.startswith(".") or not f.is_file():
            continue
        st = f.stat()
        h.update(f"{f.name}\0{_file_digest(str(f.resolve()), st.st_size, st.st_mtime_ns)}\n".encode())
    return h.hexdigest()[:16]


# ------------------------------------------------------------------------------- JSON Lines
def dumps_line(record: Any) -> str:
    """One JSON Lines record (UTF-8 kept readable; ``\\n`` inside strings is escaped by json)."""
    return json.dumps(record, ensure_ascii=False) + "\n"


def finite_json(value: Any) -> Any:
    """A copy of ``value`` with NaN and infinities replaced by None: JSON has no NaN, and a file
    with one is unreadable to strict parsers (browsers, jq)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def _default_error(message: str, path: str, line: int | None) -> Exception:
    return AttnprobeError(f"{path}, line {line}: {message}" if line is not None else f"{path}: {message}")


MAX_JSON_DEPTH = 100  # nesting deeper than this in any input is refused (no record we read needs a tenth of it)
MAX_JSON_BYTES = 64 * 1024 * 1024  # single JSON documents (meta.json ...): larger ones are refused unread


def json_depth_ok(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when ``value`` nests at most ``limit`` containers deep (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        obj, depth = stack.pop()
        if isinstance(obj, (dict, list)):
            if depth > limit:
                return False
            stack.extend((v, depth + 1) for v in (obj.values() if isinstance(obj, dict) else obj))
    return True


def parse_json(text: str, *, path: str, line: int | None, error: Callable[..., Exception]) -> Any:
    """``json.loads`` with located errors: invalid JSON (line, column) and nesting deeper than
    :data:`MAX_JSON_DEPTH` (which would otherwise end in a RecursionError somewhere later)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        at = line if line is not None else exc.lineno
        raise error(f"invalid JSON ({exc.msg} at column {exc.colno})", path=path, line=at) from None
    except RecursionError:
        raise error(f"JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)", path=path, line=line) from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits (sys.get_int_max_str_digits)
        raise error(f"invalid JSON value ({str(exc).split(';')[0]})", path=path, line=line) from None
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and not json_depth_ok(value):
        raise error(f"JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)", path=path, line=line)
    return value


def _read_text(path: Path, make: Callable[..., Exception], max_bytes: int | None = None) -> str:
    """The UTF-8 text of an input file; errors (missing, a folder, too large, not UTF-8) name the file."""
    try:
        size = path.stat().st_size if max_bytes is not None else 0
        if max_bytes is not None and size > max_bytes:
            raise make(f"{size} bytes, above the limit of {max_bytes} bytes; not read", path=str(path), line=None)
        data = path.read_bytes()
    except FileNotFoundError:
        raise make("file not found", path=str(path), line=None) from None
    except IsADirectoryError:
        raise make("is a folder, not a file", path=str(path), line=None) from None
    except PermissionError:
        raise make("permission denied", path=str(path), line=None) from None
    except OSError as exc:  # an I/O error, a name too long, ...: still one line naming the file
        raise make(f"cannot read ({exc.strerror or exc})", path=str(path), line=None) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise make(f"not UTF-8 text (byte {exc.start})", path=str(path), line=line) from None


def load_json(path: Path, *, error: Callable[..., Exception] | None = None,
              max_bytes: int | None = MAX_JSON_BYTES) -> Any:
    """One JSON document from a file: size-capped (checked before reading), UTF-8, depth-limited;
    every error names the file (and the line where there is one). An empty file is an error."""
    make = error or _default_error
    path = Path(path)
    text = _read_text(path, make, max_bytes)
    if not text.strip():
        raise make("empty file", path=str(path), line=None)
    return parse_json(text, path=str(path), line=None, error=make)


def read_jsonl(path: Path, *, error: Callable[..., Exception] | None = None, torn_tail: str = "error",
               missing_ok: bool = False) -> Iterator[tuple[int, Any]]:
    """(line number, parsed record) for every non-blank line of a JSON Lines file.

    ``error(message, path=..., line=...)`` builds the exception (each caller keeps its own error
    type; every message names the file and line). ``torn_tail``: ``"error"`` or ``"skip"`` (see the
    module docstring). ``missing_ok``: a missing file reads as empty (files we have not written yet).
    Records nested deeper than :data:`MAX_JSON_DEPTH` are errors.
    """
    if torn_tail not in ("error", "skip"):
        raise ValueError("torn_tail must be 'error' or 'skip'")
    make = error or _default_error
    path = Path(path)
    if missing_ok and not path.exists():
        return
    if path.is_dir():
        raise make("is a folder, not a JSON Lines file", path=str(path), line=None)
    text = _read_text(path, make)
    lines = text.split("\n")
    last = len(lines) if lines[-1] else len(lines) - 1  # index of the last real line (1-based)
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            record = parse_json(raw, path=str(path), line=lineno, error=make)
        except Exception:
            torn = lineno == last and not text.endswith("\n")
            if torn and torn_tail == "skip":
                log.warning("%s, line %d: ignoring a torn last line (%d bytes, no newline): an interrupted write",
                            path, lineno, len(raw.encode("utf-8")))
                continue
            raise
        yield lineno, record


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
    from tqdm.auto import tqdm

    todo = [it for it in items if not done(it)]
    counts = {"done_before": len(items) - len(todo), "done": 0, "failed": 0}
    if counts["done_before"]:
        log.info("%s: %d of %d already done, skipped", stage, counts["done_before"], len(items))
    size = max(1, batch_size)
    with tqdm(total=len(todo), desc=desc, unit=unit, disable=not progress) as bar:
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
