"""The one JSON Lines reader / appender and the one resumable loop (attnprobe/io.py)."""

from __future__ import annotations

import json
import os

import pytest

from attnprobe import io as aio
from attnprobe.errors import AttnprobeError, TrajectoryError

SEPARATORS = "\u2028\u2029\u0085\x0b\x0c\x1c\x1d\x1e"


def test_unicode_line_separators_inside_strings_round_trip(tmp_path):
    path = tmp_path / "r.jsonl"
    records = [{"text": f"a{sep}b"} for sep in SEPARATORS]
    for r in records:
        aio.append_jsonl(path, r)
    raw = path.read_text(encoding="utf-8")
    assert "\u2028" in raw  # written raw, not escaped: str.splitlines would break this file
    assert aio.read_records(path) == records
    assert [n for n, _ in aio.read_jsonl(path)] == list(range(1, len(SEPARATORS) + 1))


def test_invalid_line_names_file_and_line_with_the_callers_error_type(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"a": 1}\n\n{"a": \n{"a": 3}\n')
    with pytest.raises(TrajectoryError) as info:
        aio.read_records(path, error=TrajectoryError)
    assert info.value.line == 3 and str(path) in str(info.value) and "invalid JSON" in str(info.value)


def test_torn_tail_policy(tmp_path, caplog):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a": 3, "b": "hal')
    with pytest.raises(AttnprobeError, match="line 3"):
        aio.read_records(path)  # inputs written by a person: an error
    with caplog.at_level("WARNING"):
        assert aio.read_records(path, torn_tail="skip") == [{"a": 1}, {"a": 2}]
    assert "torn last line" in caplog.text
    # a bad line that is not the last one is always an error
    path.write_bytes(b'{"a": 1}\n{"a": 2\n{"a": 3}\n')
    with pytest.raises(AttnprobeError, match="line 2"):
        aio.read_records(path, torn_tail="skip")
    # a complete last line without a newline is a record, not a tear
    path.write_bytes(b'{"a": 1}\n{"a": 2}')
    assert aio.read_records(path) == [{"a": 1}, {"a": 2}]


def test_append_repairs_a_torn_tail_and_keeps_a_backup(tmp_path):
    path = tmp_path / "calls.jsonl"
    good = json.dumps({"id": 1}) + "\n"
    path.write_text(good + '{"id": 2, "messages": [{"role": "us')
    aio.append_jsonl(path, {"id": 3})
    assert aio.read_records(path) == [{"id": 1}, {"id": 3}]
    assert (tmp_path / "calls.jsonl.torn").read_text() == '{"id": 2, "messages": [{"role": "us\n'
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_append_retries_short_writes(tmp_path, monkeypatch):
    path = tmp_path / "x.jsonl"
    real_write = os.write

    def short_write(fd, data):  # the kernel may write fewer bytes than asked (full disk, signals)
        return real_write(fd, bytes(data[:5]))

    monkeypatch.setattr(aio.os, "write", short_write)
    aio.append_jsonl(path, {"text": "x" * 100})
    monkeypatch.undo()
    assert aio.read_records(path) == [{"text": "x" * 100}]


def test_missing_directory_and_non_utf8_inputs(tmp_path):
    assert aio.read_records(tmp_path / "none.jsonl", missing_ok=True) == []
    with pytest.raises(AttnprobeError, match="is a folder"):
        aio.read_records(tmp_path)
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"a": 1}\n{"a": "caf\xe9"}\n')
    with pytest.raises(AttnprobeError, match=r"line 2: not UTF-8"):
        aio.read_records(bad)


def test_the_executor_skips_done_logs_failures_and_batches(tmp_path):
    """What ``run_resumable`` pinned, on the executor that replaced it: finished items skipped, batches of
    ``batch_size``, a failure logged to errors.jsonl (a failed batch redone item by item, so only the bad
    item fails), an error outside ``catch`` stops the run."""
    from support.jobs import ListJob

    from attnprobe.execution import LocalExecutor

    def work(job, batch):
        if 5 in batch:
            raise ValueError("boom")

    job = ListJob(tmp_path, list(range(8)), work=work, finished=lambda x: x < 2, batch_size=3, stage="test")
    counts = LocalExecutor(lambda: None, progress=False).run(job)
    assert job.seen == [[2, 3, 4], [5, 6, 7], [5], [6], [7]]
    assert counts == {"done_before": 2, "done": 5, "failed": 1}
    logged = aio.read_records(tmp_path / "errors.jsonl")
    assert [(r["stage"], r["item"], r["error"]) for r in logged] == [("test", 5, "ValueError: boom")]
    with pytest.raises(KeyError):  # not in the job's catch: the run stops
        LocalExecutor(lambda: None, progress=False).run(ListJob(tmp_path, [1], work=lambda j, b: {}["x"]))


def test_an_append_waiting_while_the_file_is_rewritten_lands_in_the_new_file(tmp_path):
    """Ray replicas append calls to one OUT while another drops a question's stale calls (an atomic rewrite):
    an appender that waited for the lock must append to the new file, not the replaced one (lost before)."""
    import fcntl
    import os
    import threading
    import time

    path = tmp_path / "calls.jsonl"
    aio.write_jsonl(path, [{"id": "a"}, {"id": "stale"}])
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a rewriter holds the lock
    appender = threading.Thread(target=aio.append_jsonl, args=(path, {"id": "b"}))
    appender.start()
    time.sleep(0.2)  # the appender opened the old file and waits for its lock
    aio.write_jsonl(path, [{"id": "a"}])  # the rewrite replaces the file
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    appender.join(5)
    assert [r["id"] for r in aio.read_records(path)] == ["a", "b"]
    assert aio.rewrite_jsonl(path, lambda r: r["id"] != "a") == 1
    assert [r["id"] for r in aio.read_records(path)] == ["b"]
    assert aio.rewrite_jsonl(tmp_path / "missing.jsonl", lambda r: False) == 0


def test_a_lone_surrogate_is_refused_naming_file_line_and_field(tmp_path, capsys):
    """Issue 38: a lone \\ud800 escape in `import --format tags` (or any JSON input) ended in "'utf-8' codec can't
    encode character" with no file, line or field; a surrogate pair stays one character."""
    from attnprobe.cli.main import main
    from attnprobe.io import read_jsonl

    path = tmp_path / "tags.jsonl"
    path.write_text('{"id": "t0", "question": "q", "text": "<search>ok</search>"}\n'
                    '{"id": "t1", "question": "q", "text": "<search>a\\ud800</search>"}\n')
    assert main(["import", "--format", "tags", str(path), "--out", str(tmp_path / "out.jsonl")]) == 2
    assert capsys.readouterr().err == (f"attnprobe: error: {path}, line 2: field 'text': a lone surrogate \\u escape "
                                       "(not a character: it cannot be written as UTF-8)\n")
    assert not (tmp_path / "out.jsonl").exists()
    path.write_text('{"messages": [{"role": "user", "content": "x"}, {"role": "user", "\\udc00": 1}]}\n'
                    '{"text": "a\\ud83d\\ude00"}\n')
    with pytest.raises(AttnprobeError, match=r"line 1: field 'messages\[1\]\.\\udc00': a lone surrogate"):
        list(read_jsonl(path))
    path.write_text('{"text": "a\\ud83d\\ude00"}\n')
    assert list(read_jsonl(path)) == [(1, {"text": "a\U0001f600"})]
