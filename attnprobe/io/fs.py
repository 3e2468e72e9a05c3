"""Filesystem checks and names: writable outputs, regular-file inputs, folder names for ids, content
fingerprints, the lock that keeps two runs out of one output, paths kept inside an output folder (no
symlink inside one is followed: a received folder must not make us read or write elsewhere), and the
cheap completeness check of a safetensors file."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import os
import re
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from attnprobe.errors import AttnprobeError
from attnprobe.io.urls import redact


# ------------------------------------------------------------------------------- outputs
def check_folder_path(folder: Path, what: str = "output folder") -> None:
    """Refuse, in one line saying what is there, an output folder path held by a file or by a symlink that
    points nowhere (``mkdir`` would say only "File exists")."""
    if folder.is_symlink() and not folder.exists():
        raise AttnprobeError(f"{folder}: the {what} is a dangling symlink (to {os.readlink(folder)}, which does not "
                             "exist); remove the link, or create what it points to")
    if folder.exists() and not folder.is_dir():
        raise AttnprobeError(f"{folder}: the {what} is a file, not a folder")


def ensure_writable_dir(folder: Path, what: str = "output folder") -> Path:
    """Create ``folder`` if needed and prove a file can be written there, before any heavy work.

    Raises AttnprobeError naming the folder (read-only, permission denied, a file in the way, disk full).
    """
    folder = Path(folder)
    check_folder_path(folder, what)
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


# ------------------------------------------------------------------------------- inputs
_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"))


def file_kind(mode: int) -> str:
    """What a non-regular ``st_mode`` is, in words."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


class NotRegularFile(OSError):
    """An input path that is not a regular file (reading a FIFO or a device could hang or never end)."""


def _refuse_irregular(mode: int, path) -> None:
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(path))
    if not stat.S_ISREG(mode):
        raise NotRegularFile(errno.EINVAL, f"is {file_kind(mode)}, not a regular file", str(path))


def check_regular_file(path: Path) -> os.stat_result:
    """``stat`` of ``path`` (symlinks followed) when it is a regular file; else NotRegularFile naming what
    it is (IsADirectoryError for a folder). Never opens the path, so a FIFO cannot block; use it before handing a path to a library that
    opens it itself (safetensors)."""
    st = os.stat(path)
    _refuse_irregular(st.st_mode, path)
    return st


def read_regular_bytes(path: Path, max_bytes: int | None = None) -> bytes:
    """The bytes of a regular file. Opened non-blocking and checked with fstat before any read (no
    window in which a FIFO could block); larger than ``max_bytes`` -> ``EFBIG`` unread. OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        _refuse_irregular(st.st_mode, path)
        if max_bytes is not None and st.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"{st.st_size} bytes, above the limit of {max_bytes} bytes; not read",
                          str(path))
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read()
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------- names
_SAFE = re.compile(r"[A-Za-z0-9._-]+")
_HASHED = re.compile(r"-[0-9a-f]{8}$")  # what safe_name appends: an id ending like this is always hashed


def safe_name(identifier: str, default: str = "item") -> str:
    """A file or folder name for any id: readable, filesystem-safe, and injective (two different ids
    never share a name).

    An id that is already safe (letters, digits, ``._-``; no leading or trailing ``.``/``_``/``-``; at most 80
    characters) is its own name, so existing result folders keep their names. Any other id becomes a
    readable sanitised prefix plus ``-`` and 8 hex digits of the SHA-1 of the full id. A safe id that
    *ends like* such a name (``-`` and 8 hex digits) is hashed as well, so a kept id can never equal a
    hashed one (ids ``x/y`` and ``x__y-748fdbd6`` used to share a folder). Two hashed names differ
    unless 32-bit hashes of two ids collide: :func:`unique_names` checks a whole set.
    ``default`` is the prefix for an id with no safe character at all.
    """
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", identifier.replace("/", "__")).strip("._-")[:80] or default
    if readable == identifier and not _HASHED.search(identifier):
        return readable
    return f"{readable}-{hashlib.sha1(identifier.encode()).hexdigest()[:8]}"


SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SAFE_ID_RULE = "1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
"""The one rule for ids that become file names as they are (question and IBIS item ids): never ``.``, ``..``,
a hidden file, an option-like ``-rf``, or a name too long for the filesystem once an extension is added."""


def id_problem(value) -> str | None:
    """Why ``value`` (a str or int id) cannot be used as a file name (:data:`SAFE_ID`), or None when it can."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return f"use {SAFE_ID_RULE} (the id names files), not a {type(value).__name__}"
    text = str(value)
    if SAFE_ID.fullmatch(text):
        return None
    shown = repr(text) if len(text) <= 40 else repr(text[:37]) + f"... ({len(text)} characters)"
    return f"use {SAFE_ID_RULE} (the id names files), not {shown}"


def unique_names(identifiers: Iterable[str], default: str = "item") -> dict[str, str]:
    """``{id: safe_name(id)}`` for a set of ids; AttnprobeError if two different ids would share a name
    (a 32-bit hash collision, or names equal up to letter case, which collide on macOS/Windows filesystems)."""
    names: dict[str, str] = {}
    seen: dict[str, str] = {}
    for ident in identifiers:
        if ident in names:
            continue
        name = safe_name(ident, default)
        other = seen.get(name.lower())
        if other is not None:
            raise AttnprobeError(f"ids {other!r} and {ident!r} would share the output name {name!r}; rename one")
        seen[name.lower()] = ident
        names[ident] = name
    return names


# ------------------------------------------------------------------------------- fingerprints
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
    Only regular files are read (``is_file`` is False for FIFOs and devices).
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


@functools.lru_cache(maxsize=64)
def _content_digest(path: str, size: int, mtime_ns: int) -> str:  # keyed on size and mtime: an edit rehashes
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def content_hash(path: str | Path) -> str:
    """``sha256:`` and 16 hex digits of the SHA-256 of a whole file: the identity of an input that decides
    results (a study's corpus), so a file changed in place is another input and the same bytes at another
    path are the same one. Unlike :func:`fingerprint` every byte is read (once per size and mtime)."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError as exc:
        raise AttnprobeError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not path.is_file():
        raise AttnprobeError(f"{path}: not a regular file")
    return "sha256:" + _content_digest(str(path.resolve()), st.st_size, st.st_mtime_ns)[:16]


# ------------------------------------------------------------------------------- inside a folder
class OutsideFolder(AttnprobeError):
    """A path inside an output folder that leads out of it (a symlink on the way, or ``..``)."""


def inside(folder: Path, path: Path) -> Path:
    """``path`` when it lies inside ``folder`` and no part of it below ``folder`` (itself included) is a
    symlink; else :class:`OutsideFolder`, one line naming the part. Parts that do not exist yet are fine
    (they will be created as real folders). A study or output folder may come from someone else: a
    symlink in it would make us read, or write, a file anywhere the user can, so none is followed."""
    folder, path = Path(folder), Path(path)
    try:
        rel = path.relative_to(folder)
    except ValueError:
        raise OutsideFolder(f"{path}: not inside {folder}") from None
    if ".." in rel.parts:
        raise OutsideFolder(f"{path}: leads out of {folder} ('..')")
    here = folder
    for part in rel.parts:
        here = here / part
        try:
            mode = os.lstat(here).st_mode
        except FileNotFoundError:
            break
        except OSError as exc:
            raise OutsideFolder(f"{here}: cannot be checked ({exc.strerror or exc})") from None
        if stat.S_ISLNK(mode):
            raise OutsideFolder(f"{here}: is a symlink inside {folder}; symlinks in an output folder are not "
                                "followed (replace it with the real file or folder)")
    return path


def resolved_inside(root: Path, rel: str | os.PathLike, what: str = "data directory") -> Path:
    """``rel`` (relative to ``root``, or absolute) resolved, symlinks included, when it stays inside
    ``root``; else :class:`OutsideFolder`. The app's rule (it reads only inside its data directory): a
    symlink inside ``root`` may point elsewhere inside it, never out."""
    root = Path(root).resolve()
    s = os.fspath(rel)
    if "\x00" in s:
        raise OutsideFolder("path contains a NUL byte")
    cand = (root / s).resolve()  # an absolute ``s`` replaces root here, then gets checked
    if cand != root and root not in cand.parents:
        raise OutsideFolder(f"refused '{s}': it is outside the {what} {root}")
    return cand


def layout_path(folder: Path, path: Path, root: Path | None = None) -> Path:
    """The one path check of every study's Layout: with ``root`` (the app) ``path`` resolved and kept
    inside ``root`` (:func:`resolved_inside`); without (the CLI and the jobs) ``path`` kept inside
    ``folder`` with no symlink below it followed (:func:`inside`)."""
    return resolved_inside(root, path) if root is not None else inside(folder, path)


def safetensors_problem(path: Path) -> str | None:
    """Why ``path`` is not a complete safetensors file (None: it is): its header must parse and the file
    must end exactly where the header's last tensor ends, so a file cut short by a copy or a full disk is
    caught without loading a tensor (reads 8 bytes and the header only). Symlinks are not followed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return "a symlink (not followed)" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return f"{file_kind(st.st_mode)}, not a regular file"
        head = os.pread(fd, 8, 0)
        if len(head) < 8:
            return f"{st.st_size} bytes: shorter than a safetensors header"
        n = int.from_bytes(head, "little")
        if n > min(st.st_size - 8, 100 * 1024 * 1024):
            return f"header of {n} bytes in a file of {st.st_size} bytes (truncated or not safetensors)"
        try:
            header = json.loads(os.pread(fd, n, 8).decode("utf-8"))
            ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return "unreadable safetensors header"
        want = 8 + n + max(ends, default=0)
        if st.st_size != want:
            return f"{st.st_size} bytes, the header describes {want} (truncated or damaged)"
        return None
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------- locks
LOCK_NAME = ".attnprobe.lock"  # inside a locked folder (a dot-file: no reader treats it as a result)
STALE_AFTER_S = 24 * 3600  # a lock from another host (its PID cannot be checked) older than this is taken over
_HELD: dict[str, int] = {}  # lock files this process holds -> nesting depth (re-entrant)


class OutputInUse(AttnprobeError):
    """Another live process holds the lock of an output."""


def _owner(fd: int) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = json.loads(os.read(fd, 4096).decode("utf-8") or "{}")
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _alive(pid) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _stale(owner: dict, now: float) -> bool:
    """True when a recorded owner is certainly gone: its PID is dead (same host), or it is on another
    host and the lock is older than :data:`STALE_AFTER_S`. Used where the filesystem has no flock."""
    if not owner:
        return True
    if owner.get("host") == socket.gethostname():
        return not _alive(owner.get("pid"))
    started = owner.get("started")
    return not isinstance(started, (int, float)) or now - started > STALE_AFTER_S


def _describe(owner: dict) -> str:
    if not owner:
        return "another process"
    since = owner.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else "?"
    return f"process {owner.get('pid', '?')} on {owner.get('host', '?')} (since {when}: {owner.get('command', '?')})"


@contextlib.contextmanager
def hold_lock(lock_path: Path, what: str) -> Iterator[Path]:
    """Hold ``lock_path`` for the duration of the block, or raise :class:`OutputInUse` (one line naming
    ``what`` and the owner's PID, host and command) when another live process holds it.

    The lock is an ``flock`` on the file (released by the kernel when its holder dies, however it dies,
    so a crashed run never blocks the next one); the file records the owner for the message. Where the
    filesystem has no ``flock``, the recorded owner decides: a dead PID on this host, or a lock from
    another host older than :data:`STALE_AFTER_S`, is stale and taken over. Re-entrant within a process.
    The file is removed on release.
    """
    lock_path = Path(lock_path)
    key = str(lock_path.parent.resolve() / lock_path.name)  # the lock file itself is never followed
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield lock_path
        finally:
            _HELD[key] -= 1
        return
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(10):  # retry while a releasing holder unlinks the file we opened
        try:
            # O_NOFOLLOW: a symlink in place of the lock (a received folder) would have us overwrite its
            # target with the owner record; O_NONBLOCK: a FIFO there must not block the open
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                         | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise AttnprobeError(f"{lock_path}: the lock file of the {what} is a symlink; not followed "
                                     "(delete it)") from None
            raise AttnprobeError(f"{lock_path.parent}: cannot create the lock for the {what} "
                                 f"({exc.strerror or exc})") from None
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise AttnprobeError(f"{lock_path}: the lock file of the {what} is {file_kind(mode)}, not a regular "
                                 "file (delete it)")
        os.set_blocking(fd, True)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _owner(fd)
            os.close(fd)
            raise OutputInUse(f"{lock_path.parent}: the {what} is in use by {_describe(owner)}; wait for it to "
                              f"finish or choose another output (lock file {lock_path.name})") from None
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL):
                os.close(fd)
                raise
            owner = _owner(fd)  # no flock here (some network filesystems): trust the recorded owner
            if owner and owner.get("pid") != os.getpid() and not _stale(owner, time.time()):
                os.close(fd)
                raise OutputInUse(f"{lock_path.parent}: the {what} is in use by {_describe(owner)}; wait for it "
                                  f"to finish, or delete {lock_path} if it is not running") from None
        try:
            same = os.fstat(fd).st_ino == os.lstat(lock_path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # we locked a file its holder had just unlinked: lock the new one
    else:
        raise OutputInUse(f"{lock_path.parent}: could not take the lock of the {what} (it keeps changing)")
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
              "command": redact(" ".join([os.path.basename(sys.argv[0] or "python"), *sys.argv[1:]]))[:300]}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    _HELD[key] = 1
    try:
        yield lock_path
    finally:
        del _HELD[key]
        with contextlib.suppress(OSError):
            os.unlink(lock_path)
        os.close(fd)


def hold_dir_lock(folder: Path, what: str = "output folder"):
    """:func:`hold_lock` on ``folder/.attnprobe.lock`` (the folder is created): one run per output folder."""
    folder = Path(folder)
    check_folder_path(folder, what)
    return hold_lock(folder / LOCK_NAME, what)


def hold_file_lock(path: Path, what: str = "output file"):
    """:func:`hold_lock` for an output that is a file (and its siblings): ``.<name>.lock`` beside it."""
    path = Path(path)
    return hold_lock(path.with_name(f".{path.name}.lock"), f"{what} {path.name}")


@contextlib.contextmanager
def flocked(fd: int) -> Iterator[None]:
    """An exclusive ``flock`` on an open file for the block (blocking; a no-op where unsupported):
    appends from several processes to one file are serialised, never interleaved."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL):
            raise
        yield
        return
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
