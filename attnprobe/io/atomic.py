"""Atomic writes: a file or a folder is either the old version or the new one, never half of either.

Files are written under a hidden temporary name, fsynced and renamed into place; folders are built by
:class:`AtomicDir` and swapped in. :func:`recover_atomic_dirs` cleans up after a writer that was killed.
Every OSError raised without a file name (a full disk, a failed fsync) is given the name of the file
being written, so the one-line error says where.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("attnprobe.io")


@contextlib.contextmanager
def naming(path: Path):
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
        with naming(path), os.fdopen(fd, "wb") as fh:
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
                with naming(self.target / f.name), open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        os.chmod(tmp, 0o755)  # mkdtemp creates 0700
        _fsync_dir(tmp)
        target = self.target
        if target.is_symlink():  # never swap into (or keep) a symlink: the new folder replaces the link itself
            target.unlink()
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
