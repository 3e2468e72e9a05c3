"""attnprobe/io.py under faults: folder replacement killed at every step, JSON limits, fingerprints,
writability checks (issue 13, items 2, 4, 5, 6)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap

import pytest

from attnprobe import io as aio
from attnprobe.errors import AttnprobeError, TrajectoryError

IS_ROOT = os.geteuid() == 0


# ------------------------------------------------------------------ AtomicDir killed mid-save
def _kill_inside_save(parent, point: str, exchange: bool) -> None:
    """Replace parent/res (holding old.txt) with a folder holding new.txt in a child process that
    SIGKILLs itself at ``point``: the state a crash leaves on disk, with no cleanup code run."""
    script = textwrap.dedent(f"""
        import os, signal, shutil
        from pathlib import Path
        from attnprobe import io as aio

        def die(*a, **k):
            os.kill(os.getpid(), signal.SIGKILL)

        point = {point!r}
        if not {exchange!r}:
            aio.atomic._exchange = lambda a, b: False  # a filesystem without renameat2: two renames
        if point == "after-exchange":
            aio.shutil.rmtree = die  # the next step after the exchange is removing the old copy
        if point == "between-renames":
            real = os.replace
            calls = []
            def replace(a, b):
                calls.append(a)
                real(a, b)
                if len(calls) == 1:
                    die()
            aio.os.replace = replace
        with aio.AtomicDir(Path({str(parent)!r}) / "res") as tmp:
            (tmp / "new.txt").write_text("new")
            if point == "while-building":
                die()
        raise SystemExit("not killed")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr


@pytest.mark.parametrize("point,exchange,expect", [
    ("while-building", True, "old"),
    ("after-exchange", True, "new"),
    ("while-building", False, "old"),
    ("between-renames", False, "old"),  # the old folder was renamed away: it must come back
    ("after-exchange", False, "new"),  # (rmtree of the old copy after the second rename)
])
def test_atomic_dir_killed_at_any_point_leaves_old_or_new_never_missing(tmp_path, point, exchange, expect):
    target = tmp_path / "res"
    target.mkdir()
    (target / "old.txt").write_text("old")
    (tmp_path / "other").mkdir()  # a sibling result: untouched by the recovery
    _kill_inside_save(tmp_path, point, exchange)
    hidden_before = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))
    assert hidden_before, "the kill should leave a work folder behind"
    if point == "between-renames":
        assert not target.exists()  # the moment the old code lost results
    done = aio.recover_atomic_dirs(tmp_path)
    assert len(done) == len(hidden_before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "res"]
    assert sorted(p.name for p in target.iterdir()) == [f"{expect}.txt"]
    assert (target / f"{expect}.txt").read_text() == expect
    assert aio.recover_atomic_dirs(tmp_path) == []  # nothing left to do


def test_recover_handles_the_names_older_versions_left(tmp_path):
    (tmp_path / ".a.old").mkdir()  # killed between the two renames of the old AtomicDir
    (tmp_path / ".a.old" / "meta.json").write_text("{}")
    (tmp_path / ".b.k2x9_q7z").mkdir()  # mkdtemp's old naming: a half-built folder
    (tmp_path / ".git").mkdir()  # not ours: never touched
    (tmp_path / ".cache.settings").write_text("a file, not a folder: never touched")
    done = aio.recover_atomic_dirs(tmp_path)
    assert done == ["restored a from .a.old (a replacement was interrupted)",
                    "removed .b.k2x9_q7z (left by an interrupted write)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".cache.settings", ".git", "a"]
    assert (tmp_path / "a" / "meta.json").read_text() == "{}"


def test_atomic_dir_files_are_shared_and_failures_leave_nothing(tmp_path):
    with aio.AtomicDir(tmp_path / "r") as tmp:
        (tmp / "x.bin").write_bytes(b"1")
        os.chmod(tmp / "x.bin", 0o600)  # as some writers create them
    assert oct((tmp_path / "r" / "x.bin").stat().st_mode & 0o777) == "0o644"
    assert oct((tmp_path / "r").stat().st_mode & 0o777) == "0o755"
    with pytest.raises(RuntimeError), aio.AtomicDir(tmp_path / "r") as tmp:
        (tmp / "y.bin").write_bytes(b"2")
        raise RuntimeError("boom")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["x.bin"]


def test_atomic_dir_disk_full_keeps_the_old_folder(tmp_path, monkeypatch):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "old.txt").write_text("old")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(aio.os, "fsync", full)
    with pytest.raises(OSError) as info, aio.AtomicDir(tmp_path / "r") as tmp:
        (tmp / "new.txt").write_text("new")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(tmp_path / "r" / "new.txt")

    def short_disk(self, data):  # a write that fails without naming its file, like a full disk
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.undo()
    monkeypatch.setattr(type(tmp_path), "write_bytes", short_disk)
    with pytest.raises(OSError) as info, aio.AtomicDir(tmp_path / "r") as tmp:
        (tmp / "new.bin").write_bytes(b"x")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(tmp_path / "r")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]
    assert (tmp_path / "r" / "old.txt").read_text() == "old"


# ------------------------------------------------------------------ JSON inputs
def test_deeply_nested_json_is_a_located_error_not_a_recursion_error(tmp_path):
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"a": 1}\n' + '{"x": ' + "[" * 100000 + "]" * 100000 + "}\n")
    with pytest.raises(TrajectoryError) as info:
        aio.read_records(deep, error=TrajectoryError)
    assert info.value.line == 2 and "nested too deeply" in str(info.value) and str(deep) in str(info.value)
    # deeper than the limit but shallow enough for Python's parser: still refused (later stages recurse)
    deep.write_text(json.dumps({"x": json.loads("[" * 150 + "]" * 150)}) + "\n")
    with pytest.raises(AttnprobeError, match=r"line 1: JSON nested too deeply \(more than 100 levels\)"):
        aio.read_records(deep)
    # exactly at the limit is fine
    deep.write_text("[" * 100 + "]" * 100 + "\n")
    assert aio.read_records(deep) == [json.loads("[" * 100 + "]" * 100)]
    one = tmp_path / "deep.json"
    one.write_text("[" * 5000 + "]" * 5000)
    with pytest.raises(AttnprobeError, match="deep.json: JSON nested too deeply"):
        aio.load_json(one)


def test_an_integer_too_long_to_convert_is_a_located_error(tmp_path):
    """json.loads raises a plain ValueError for integers over 4300 digits (found by the issue-13 audit)."""
    big = tmp_path / "big.jsonl"
    big.write_text('{"a": 1}\n{"id": ' + "7" * 5000 + "}\n")
    with pytest.raises(TrajectoryError) as info:
        aio.read_records(big, error=TrajectoryError)
    assert info.value.line == 2 and str(big) in str(info.value) and "invalid JSON value (Exceeds the limit" in str(info.value)
    one = tmp_path / "big.json"
    one.write_text('{"x": ' + "1" * 5000 + "}")
    with pytest.raises(AttnprobeError, match="big.json: invalid JSON value"):
        aio.load_json(one)


def test_load_json_names_file_and_line(tmp_path):
    p = tmp_path / "m.json"
    p.write_bytes(b'{\n "a": 1,\n "b": "caf\xe9"\n}')
    with pytest.raises(AttnprobeError, match=r"m.json, line 3: not UTF-8 text \(byte 21\)"):
        aio.load_json(p)
    p.write_text('{\n "a": 1,\n "b": \n}')
    with pytest.raises(AttnprobeError, match=r"m.json, line 4: invalid JSON \(Expecting value at column 1\)"):
        aio.load_json(p)
    p.write_text("  \n")
    with pytest.raises(AttnprobeError, match=r"m.json: empty file"):
        aio.load_json(p)
    with pytest.raises(AttnprobeError, match=r"is a folder, not a file"):
        aio.load_json(tmp_path)
    with pytest.raises(AttnprobeError, match=r"none.json: file not found"):
        aio.load_json(tmp_path / "none.json")
    p.write_text('{"a": [1, 2]}')
    assert aio.load_json(p) == {"a": [1, 2]}


def test_oversized_json_is_refused_without_reading_it(tmp_path, monkeypatch):
    big = tmp_path / "meta.json"
    with open(big, "wb") as fh:  # sparse: 65 MiB on paper, nothing on disk
        fh.write(b'{"a": "')
        fh.truncate(65 * 1024 * 1024)
    read = []
    real = type(big).read_bytes
    monkeypatch.setattr(type(big), "read_bytes", lambda self: read.append(self) or real(self))
    with pytest.raises(AttnprobeError, match=r"meta.json: 68157440 bytes, above the limit of 67108864 bytes; not read"):
        aio.load_json(big)
    assert read == []


def test_finite_json_replaces_nan():
    value = {"a": float("nan"), "b": [1.0, float("inf"), {"c": -float("inf")}], "d": "nan", "e": 2}
    assert aio.finite_json(value) == {"a": None, "b": [1.0, None, {"c": None}], "d": "nan", "e": 2}
    json.dumps(aio.finite_json(value), allow_nan=False)


# ------------------------------------------------------------------ fingerprints
def test_fingerprint_follows_content_not_names_or_times(tmp_path):
    size = 3 * 1024 * 1024
    data = bytearray(os.urandom(size))
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(data)
    b.write_bytes(data)
    os.utime(b, ns=(1, 1))
    assert aio.fingerprint(a) == aio.fingerprint(b) and len(aio.fingerprint(a)) == 16
    data[size // 2 + 10] ^= 0xFF  # a byte inside the middle sample
    b.write_bytes(data)
    assert aio.fingerprint(b) != aio.fingerprint(a)
    b.write_bytes(bytes(data[:-1]))  # a truncated copy
    assert aio.fingerprint(b) != aio.fingerprint(a)
    # folders: configs hashed whole, file names count, hidden files do not
    for name in ("m1", "m2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text('{"layers": 30}')
        (tmp_path / name / "model.safetensors").write_bytes(bytes(data))
    (tmp_path / "m2" / ".lock").write_text("x")
    assert aio.fingerprint(tmp_path / "m1") == aio.fingerprint(tmp_path / "m2")
    (tmp_path / "m2" / "config.json").write_text('{"layers": 31}')
    assert aio.fingerprint(tmp_path / "m1") != aio.fingerprint(tmp_path / "m2")


# ------------------------------------------------------------------ outputs checked before work
def test_writable_checks(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(AttnprobeError, match=r"file: the output folder is a file, not a folder"):
        aio.ensure_writable_dir(f)
    with pytest.raises(AttnprobeError, match=r"not writable"):
        aio.ensure_writable_dir(f / "sub")  # a file where a folder is expected
    with pytest.raises(AttnprobeError, match=r"the report is a folder"):
        aio.ensure_writable_file(tmp_path, "report")
    assert aio.ensure_writable_dir(tmp_path / "new" / "deeper").is_dir()
    assert sorted(p.name for p in (tmp_path / "new" / "deeper").iterdir()) == []  # the probe file is gone


@pytest.mark.skipif(IS_ROOT, reason="root writes into read-only folders; test_writable_checks covers the root case")
def test_read_only_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    try:
        with pytest.raises(AttnprobeError, match=r"ro: the output folder is not writable \(Permission denied\)"):
            aio.ensure_writable_dir(ro)
    finally:
        os.chmod(ro, 0o755)
