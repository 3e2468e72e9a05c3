"""attnprobe.io hardening (issue 22): injective folder names, regular-file reads (a FIFO never hangs),
strict JSON (duplicate keys and NaN refused, never written), output locks and locked appends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from attnprobe import io as aio
from attnprobe.errors import AttnprobeError, TrajectoryError


# ------------------------------------------------------------------ names
def test_safe_name_is_injective_on_ids_that_collided():
    """`x/y` sanitises to `x__y` + its hash, which is itself a safe id: today's scheme gave both one folder."""
    assert aio.safe_name("x/y") == "x__y-748fdbd6"
    assert aio.safe_name("x__y-748fdbd6") != aio.safe_name("x/y")
    assert aio.safe_name("x__y-748fdbd6").startswith("x__y-748fdbd6-")  # hashed again, still readable
    # ids that are already safe keep their names (shipped and baseline folders do not move)
    for ident in ("sample-long-research", "q001", "a.b_c-d", "x-1234567", "x-abcdefgh", "x-ABCDEF12"):
        assert aio.safe_name(ident) == ident
    # sanitising collapses many ids onto one readable prefix: the hash keeps them apart
    ids = ["a b", "a_b", "a/b", "a__b", "a:b", "a\tb", "a  b", ".a_b", "a_b.", "_a_b", "a" * 81, "a" * 82, "", "é",
           "x__y-748fdbd6", "x/y", "x__y-748fdbd6-" + "0" * 8]
    names = [aio.safe_name(i) for i in ids]
    assert len(set(names)) == len(ids), dict(zip(ids, names))
    for n in names:
        assert n and len(n) <= 89 and n[0] not in "._" and all(c.isalnum() or c in "._-" for c in n)


def test_unique_names_refuses_ids_that_share_a_name():
    assert aio.unique_names(["a", "b/c", "a"]) == {"a": "a", "b/c": aio.safe_name("b/c")}
    with pytest.raises(AttnprobeError, match=r"ids 'Run' and 'run' would share the output name"):
        aio.unique_names(["Run", "run"])  # one folder on case-insensitive filesystems


# ------------------------------------------------------------------ regular files only
def _returns_within(fn, seconds: float):
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still blocked after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "meta.json"
    os.mkfifo(fifo)
    with pytest.raises(AttnprobeError, match=r"meta.json: is a FIFO \(named pipe\), not a regular file"):
        _returns_within(lambda: aio.load_json(fifo), 5)
    with pytest.raises(TrajectoryError, match=r"is a FIFO"):
        _returns_within(lambda: aio.read_records(fifo, error=TrajectoryError), 5)
    with pytest.raises(aio.NotRegularFile, match="FIFO"):
        aio.check_regular_file(fifo)
    with pytest.raises(AttnprobeError, match=r"is a character device, not a regular file"):
        _returns_within(lambda: aio.load_json(Path("/dev/zero"), max_bytes=None), 5)  # would never end
    with pytest.raises(IsADirectoryError):
        aio.check_regular_file(tmp_path)


# ------------------------------------------------------------------ strict JSON
def test_duplicate_keys_and_non_finite_numbers_are_refused_with_file_line_and_key(tmp_path):
    doc = tmp_path / "m.json"
    doc.write_text('{\n "a": 1,\n "b": {"c": 2},\n "a": 3\n}\n')
    with pytest.raises(AttnprobeError, match=r"m.json, line 4: invalid JSON: duplicate key 'a'"):
        aio.load_json(doc)
    lines = tmp_path / "r.jsonl"
    lines.write_text('{"id": 1}\n{"id": 2, "x": {"k": 1, "k": 2}}\n')
    with pytest.raises(TrajectoryError, match=r"r.jsonl, line 2: invalid JSON: duplicate key 'k'"):
        aio.read_records(lines, error=TrajectoryError)
    for bad, word in (("NaN", "NaN"), ("Infinity", "Infinity"), ("-Infinity", "-Infinity")):
        lines.write_text(f'{{"id": 1}}\n{{"answer": {bad}}}\n')
        with pytest.raises(AttnprobeError, match=rf"r.jsonl, line 2: invalid JSON: {word} is not a JSON number"):
            aio.read_records(lines)
    lines.write_text('{"answer": 1e999}\n')
    with pytest.raises(AttnprobeError, match=r"line 1: invalid JSON: a number overflows to infinity"):
        aio.read_records(lines)
    lines.write_text('{"answer": 1e99, "b": "NaN"}\n')  # a large finite number, a string: fine
    assert aio.read_records(lines) == [{"answer": 1e99, "b": "NaN"}]


def test_nothing_non_finite_is_written(tmp_path, caplog):
    assert aio.dumps_line({"a": float("nan"), "b": [1.5, float("inf")]}) == '{"a": null, "b": [1.5, null]}\n'
    assert "NaN or an infinity" in caplog.text
    path = tmp_path / "x.jsonl"
    aio.append_jsonl(path, {"v": float("-inf")})
    assert aio.read_records(path) == [{"v": None}]  # and it reads back under the strict reader


# ------------------------------------------------------------------ locks
HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from attnprobe.io import hold_dir_lock
    with hold_dir_lock(Path(sys.argv[1])):
        print("held", flush=True)
        time.sleep(60)
""")


def test_a_folder_in_use_is_refused_in_one_line_naming_the_owner(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(aio.OutputInUse) as err, aio.hold_dir_lock(out):
            pass
        msg = str(err.value)
        assert "\n" not in msg and f"{out}: the output folder is in use by process {proc.pid} on " in msg
    finally:
        proc.kill()
        proc.wait()
    # the holder died (SIGKILL): its lock went with it, and the next run takes the folder
    with aio.hold_dir_lock(out) as lock:
        owner = json.loads(lock.read_text())
        assert owner["pid"] == os.getpid()
        with aio.hold_dir_lock(out):  # re-entrant in one process
            pass
        assert lock.exists()
    assert not (out / aio.LOCK_NAME).exists()  # removed on release: nothing left behind


def test_a_stale_lock_file_is_taken_over(tmp_path, monkeypatch):
    """Without flock (some network filesystems) the recorded owner decides: a dead PID on this host, or
    another host's lock older than STALE_AFTER_S, is stale; a live one is refused."""
    import errno
    import socket

    from attnprobe.io import fs

    def no_flock(fd, op):
        if op & fs.fcntl.LOCK_NB:
            raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fs.fcntl, "flock", no_flock)
    out = tmp_path / "o"
    out.mkdir()
    lock = out / aio.LOCK_NAME
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname(), "started": time.time()}))
    with aio.hold_dir_lock(out):
        pass
    lock.write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": time.time() - aio.STALE_AFTER_S - 5}))
    with aio.hold_dir_lock(out):
        pass
    lock.write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": time.time()}))
    with pytest.raises(aio.OutputInUse, match=r"in use by process 1 on elsewhere"), aio.hold_dir_lock(out):
        pass


APPENDER = textwrap.dedent("""
    import sys
    from attnprobe.io import append_jsonl
    for i in range(150):
        append_jsonl(sys.argv[1], {"writer": sys.argv[2], "i": i, "pad": "x" * 5000})
""")


def test_concurrent_appends_never_interleave(tmp_path):
    path = tmp_path / "a.jsonl"
    procs = [subprocess.Popen([sys.executable, "-c", APPENDER, str(path), w]) for w in "ab"]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    recs = aio.read_records(path)
    assert len(recs) == 300
    for w in "ab":
        assert [r["i"] for r in recs if r["writer"] == w] == list(range(150))


def test_a_full_disk_during_an_append_names_the_file(tmp_path, monkeypatch):
    import errno

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    path = tmp_path / "runs" / "x.results.ndjson"
    monkeypatch.setattr(aio.os, "fsync", full)
    with pytest.raises(OSError) as err:
        aio.append_jsonl(path, {"a": 1})
    assert err.value.filename == str(path) and err.value.errno == errno.ENOSPC


def test_appending_to_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "calls.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(OSError) as err:  # ENXIO (no reader) or "not a regular file": never a hang
        _returns_within(lambda: aio.append_jsonl(fifo, {"a": 1}), 5)
    assert err.value.filename == str(fifo)
