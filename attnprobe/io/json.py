"""JSON and JSON Lines: the one strict reader, the one appender, the one line format.

Rules (one place, so every file behaves the same):

- input JSON is strict: a key twice in one object, ``NaN``/``Infinity`` (or a number that overflows to
  infinity) and nesting deeper than :data:`MAX_JSON_DEPTH` are errors naming file, line and key; files
  are read only when they are regular files (a FIFO or a device is refused before it is opened
  blocking). Nothing non-finite is written either: :func:`dumps_line` writes ``null`` for it (and says so).
- records are split on ``\\n`` only. JSON allows U+2028, U+0085, form feeds ... raw inside strings,
  and our own writers emit them raw (``ensure_ascii=False``); ``str.splitlines`` would break there.
- a *torn tail* (a last line with no newline that does not parse: a crash mid-append) is handled
  by an explicit policy: ``"error"`` for inputs a person wrote, ``"skip"`` for files we append to
  (reported through :mod:`logging`, never silently). Invalid JSON anywhere else is always an error
  naming file and line.
- :func:`append_jsonl` holds an ``flock`` on the file while it repairs a torn tail (truncates it away,
  keeping a ``.torn`` backup) and appends, writes every byte (short writes are retried) and fsyncs, so
  a record either exists whole or not at all, and two processes never interleave.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from attnprobe.errors import AttnprobeError
from attnprobe.io.atomic import atomic_write_text, naming
from attnprobe.io.fs import NotRegularFile, file_kind, flocked, read_regular_bytes

log = logging.getLogger("attnprobe.io")


def write_jsonl(path: Path, records: Iterable[Any]) -> None:
    """Replace a JSON Lines file atomically with ``records``."""
    atomic_write_text(path, "".join(dumps_line(r) for r in records))


def dumps_line(record: Any) -> str:
    """One JSON Lines record (UTF-8 kept readable; ``\\n`` inside strings is escaped by json).
    NaN and infinities, which JSON does not have, are written as ``null`` with a warning."""
    try:
        return json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n"
    except ValueError:
        log.warning("a record held NaN or an infinity, written as null (JSON has neither)")
        return json.dumps(finite_json(record), ensure_ascii=False, allow_nan=False) + "\n"


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


class _Refused(ValueError):
    """A valid-looking JSON text the strict reader refuses (a duplicate key, a non-finite number)."""

    def __init__(self, message: str, token: str):
        super().__init__(message)
        self.token = token


def _pairs(pairs: list) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _Refused(f"duplicate key {dup!r} (a key may appear once per object)", json.dumps(dup) + ":")
    return d


def _constant(name: str):
    raise _Refused(f"{name} is not a JSON number (write null or a finite number)", name)


_BIG_EXPONENT = re.compile(r"[0-9][eE][+-]?[0-9]{3}")


def _finite(value: Any) -> bool:
    stack = [value]
    while stack:
        obj = stack.pop()
        if isinstance(obj, float) and not math.isfinite(obj):
            return False
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, list):
            stack.extend(obj)
    return True


def _line_of(text: str, token: str, occurrence: int) -> int | None:
    """The line of the ``occurrence``-th appearance of ``token`` (best effort: for error messages)."""
    pos = -1
    for _ in range(occurrence):
        pos = text.find(token, pos + 1)
        if pos < 0:
            return None
    return text.count("\n", 0, pos) + 1


def loads_strict(text: str) -> Any:
    """``json.loads`` that refuses duplicate keys and NaN/Infinity (ValueError; a JSONDecodeError for
    invalid JSON). For texts that are not files (HTTP bodies); files go through :func:`parse_json`."""
    value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant)
    if _BIG_EXPONENT.search(text) and not _finite(value):
        raise _Refused("a number overflows to infinity", "e")
    return value


def parse_json(text: str, *, path: str, line: int | None, error: Callable[..., Exception]) -> Any:
    """Strict ``json.loads`` with located errors: invalid JSON (line, column), a duplicate key or a
    NaN/Infinity (line and key), nesting deeper than :data:`MAX_JSON_DEPTH` (which would otherwise end
    in a RecursionError somewhere later)."""
    try:
        value = loads_strict(text)
    except json.JSONDecodeError as exc:
        at = line if line is not None else exc.lineno
        raise error(f"invalid JSON ({exc.msg} at column {exc.colno})", path=path, line=at) from None
    except _Refused as exc:
        at = line if line is not None else _line_of(text, exc.token, 2 if exc.token.endswith(":") else 1)
        raise error(f"invalid JSON: {exc}", path=path, line=at) from None
    except RecursionError:
        raise error(f"JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)", path=path, line=line) from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits (sys.get_int_max_str_digits)
        raise error(f"invalid JSON value ({str(exc).split(';')[0]})", path=path, line=line) from None
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and not json_depth_ok(value):
        raise error(f"JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)", path=path, line=line)
    if _SURROGATE_ESCAPE.search(text) and (where := _lone_surrogate(value)) is not None:
        raise error(f"field {where}: a lone surrogate \\u escape (not a character: it cannot be written as UTF-8)",
                    path=path, line=line)
    return value


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # cheap test first: only \uD800-\uDFFF escapes make one
_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(value: Any) -> str | None:
    """The field (``messages[2].content``; ``'(top level)'``) of the first key or string holding a lone
    surrogate, or None (a surrogate pair escape decodes to one character: no surrogate left)."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        obj, where = stack.pop()
        if isinstance(obj, str) and _SURROGATE.search(obj):
            return repr(where or "(top level)")
        if isinstance(obj, dict):
            for k, v in reversed(list(obj.items())):
                key = f"{where}.{k}" if where else str(k)
                if _SURROGATE.search(k):
                    return repr(key)
                stack.append((v, key))
        elif isinstance(obj, list):
            stack.extend((v, f"{where}[{i}]") for i, v in reversed(list(enumerate(obj))))
    return None


def _read_text(path: Path, make: Callable[..., Exception], max_bytes: int | None = None) -> str:
    """The UTF-8 text of an input file; errors (missing, a folder, a FIFO or device, too large, not UTF-8)
    name the file. Only regular files are read (checked before the first blocking call)."""
    try:
        data = read_regular_bytes(path, max_bytes)
    except FileNotFoundError:
        raise make("file not found", path=str(path), line=None) from None
    except IsADirectoryError:
        raise make("is a folder, not a file", path=str(path), line=None) from None
    except PermissionError:
        raise make("permission denied", path=str(path), line=None) from None
    except NotRegularFile as exc:
        raise make(exc.strerror, path=str(path), line=None) from None
    except OSError as exc:  # an I/O error, too large, a name too long, ...: still one line naming the file
        raise make(exc.strerror if exc.errno == errno.EFBIG else f"cannot read ({exc.strerror or exc})",
                   path=str(path), line=None) from None
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
        bak = os.open(path.with_name(path.name + ".torn"),  # never through a symlink (O_NOFOLLOW)
                      os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        try:
            mode = os.fstat(bak).st_mode
            if not stat.S_ISREG(mode):
                raise NotRegularFile(errno.EINVAL, f"is {file_kind(mode)}, not a regular file", f"{path}.torn")
            os.write(bak, fragment + b"\n")
        finally:
            os.close(bak)
        fh.truncate(cut)
        fh.flush()
        os.fsync(fh.fileno())
    log.warning("%s: removed a torn last line of %d bytes (an interrupted write; kept in %s.torn)",
                path, len(fragment), path.name)
    return len(fragment)


def append_jsonl(path: Path, record: Any) -> None:
    """Append one record durably, holding an ``flock`` on the file: torn tail repaired first, every byte
    written, fsync. Concurrent appenders (two runs, Ray replicas) are serialised, never interleaved; an
    appender that waited while :func:`rewrite_jsonl` replaced the file appends to the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = dumps_line(record).encode("utf-8")
    while not _append_once(path, data):
        pass


def _append_once(path: Path, data: bytes) -> bool:
    """One try of :func:`append_jsonl`; False when the file was replaced while we waited for its lock."""
    # non-blocking open + fstat: a FIFO in place of the file would block the open (or the writes) forever
    # O_NOFOLLOW: a symlink in place of the file (a received output folder) would append elsewhere
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise AttnprobeError(f"{path}: is a symlink; not followed (replace it with the real file)") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(errno.EINVAL, f"is {file_kind(mode)}, not a regular file", str(path))
        os.set_blocking(fd, True)
        with flocked(fd), naming(path):
            if not _still_at(fd, path):
                return False
            repair_torn_tail(path)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        return True
    finally:
        os.close(fd)


def _still_at(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is still the one at ``path`` (not replaced by an atomic rewrite)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    here = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)


def rewrite_jsonl(path: Path, keep: Callable[[Any], bool]) -> int:
    """Keep only the records of ``path`` for which ``keep`` is true (atomic replace), holding the file's
    ``flock`` from the read to the replace, so no concurrent :func:`append_jsonl` is lost (it waits, then
    appends to the new file). A torn tail is skipped. Returns the number of records dropped."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise AttnprobeError(f"{path}: is a symlink; not followed (replace it with the real file)") from None
        raise
    try:
        with flocked(fd):
            records = read_records(path, torn_tail="skip")
            kept = [r for r in records if keep(r)]
            if len(kept) != len(records):
                write_jsonl(path, kept)
            return len(records) - len(kept)
    finally:
        os.close(fd)
