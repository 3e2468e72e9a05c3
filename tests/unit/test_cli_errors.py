"""The CLI's one error boundary: every bad input or unusable output is one line naming file, line and
field, with the documented exit code and no traceback (issue 13, items 5, 6, 10). No model is loaded:
inputs and outputs are checked before any heavy work."""

from __future__ import annotations

import errno
import json

import pytest

from attnprobe import io as aio
from attnprobe.capture.models import ModelSpec
from attnprobe.cli.main import describe_error, main

USER = {"role": "user", "content": "hi"}
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]}


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("attnprobe: error: "), err
    return lines[0]


def _write(path, text: str | bytes):
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


# ------------------------------------------------------------------ attnprobe import: the malformed shapes
MALFORMED = [  # (format, record on line 2, field, reason)
    ("openai", {"messages": "hi"}, "messages", "expected a list of messages"),
    ("openai", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "got int"),
    ("openai", {"messages": [{"role": "user", "content": [1, 2]}]}, "messages[0].content", "got list"),
    ("openai", {"messages": [USER, {"role": "assistant", "content": "x", "tool_calls": "abc"}]},
     "messages[1].tool_calls", "expected a list"),
    ("openai", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "got 'robot'"),
    ("openai", {"messages": [5]}, "messages[0]", "a message must be a JSON object"),
    ("openai", {"messages": [USER], "tools": "x"}, "tools", "expected a list"),
    ("openai", {"messages": [USER], "id": {"a": 1}}, "id", "must be a non-empty string"),
    ("openai", {"messages": [USER], "id": True}, "id", "got True"),
    ("openai", {"messages": [USER, {"role": "tool", "content": "obs"}]}, "messages[1].role",
     "must follow an assistant message with tool_calls"),
    ("masking", {"qid": 1, "full_messages": "x"}, "full_messages", "non-empty list"),
    ("masking", {"qid": None, "full_messages": [USER]}, "qid", "got None"),
    ("smolagents", {"messages": [USER, {"role": "tool-call", "content": "Calling tools: [1]"}]},
     "messages[1].content", "tool call 0 has no function name"),
    ("smolagents", {"messages": [{"role": "user", "content": 7}]}, "messages[0].content", "got int"),
    ("smolagents", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "'wizard'"),
]


@pytest.mark.parametrize("fmt,record,field,reason", MALFORMED)
def test_import_malformed_shapes_name_file_line_and_field(tmp_path, capsys, fmt, record, field, reason):
    good = {"qid": "ok", "full_messages": [USER]} if fmt == "masking" else {"messages": [USER, CALL]} \
        if fmt == "openai" else {"messages": [USER, {"role": "assistant", "content": "done"}]}
    src = _write(tmp_path / "log.jsonl", json.dumps(good) + "\n" + json.dumps(record) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["import", str(src), "--format", fmt, "--out", str(out)]) == 2
    line = _one_error_line(capsys)
    assert f"{src}, line 2, field '{field}': " in line and reason in line
    assert not out.exists()


@pytest.mark.parametrize("name,content,where,reason", [
    ("deep.jsonl", '{"messages": [' + "[" * 50000 + "]" * 50000 + "]}\n", "line 1", "nested too deeply"),
    ("deep.json", '{"messages": ' + "[" * 3000 + "]" * 3000 + "}", "", "nested too deeply"),
    ("latin1.jsonl", b'{"messages": [{"role": "user", "content": "hi"}]}\n{"x": "caf\xe9"}\n', "line 2",
     "not UTF-8 text (byte 60)"),
    ("empty.jsonl", "", "", "no records in this file (it is empty)"),
    ("blank.jsonl", "\n\n  \n", "", "no records in this file (it is empty)"),
    ("empty.json", "", "", "empty file"),
])
def test_import_unreadable_inputs(tmp_path, capsys, name, content, where, reason):
    src = _write(tmp_path / name, content)
    assert main(["import", str(src), "--format", "openai", "--out", str(tmp_path / "o.jsonl")]) == 2
    line = _one_error_line(capsys)
    assert f"{src}{', ' + where if where else ''}: " in line and reason in line


def test_import_directory_as_input_and_as_output(tmp_path, capsys):
    assert main(["import", str(tmp_path), "--format", "openai", "--out", str(tmp_path / "o.jsonl")]) == 2
    assert f"attnprobe: error: {tmp_path}: is a folder" in _one_error_line(capsys)
    src = _write(tmp_path / "a.jsonl", json.dumps({"messages": [USER]}) + "\n")
    assert main(["import", str(src), "--format", "openai", "--out", str(tmp_path)]) == 2
    assert f"{tmp_path}: the output trajectory file is a folder" in _one_error_line(capsys)


def test_import_duplicate_ids_across_files_name_both_places(tmp_path, capsys):
    a = _write(tmp_path / "a.jsonl", json.dumps({"id": "x", "messages": [USER]}) + "\n")
    b = _write(tmp_path / "b.jsonl", json.dumps({"id": "y", "messages": [USER]}) + "\n"
               + json.dumps({"id": "x", "messages": [USER]}) + "\n")
    out = tmp_path / "o.jsonl"
    assert main(["import", str(a), str(b), "--format", "openai", "--out", str(out)]) == 2
    line = _one_error_line(capsys)
    assert f"{b}, line 2, field 'id': duplicate trajectory id 'x': also at {a}, line 1" in line
    assert not out.exists()
    assert main(["import", str(a), "--format", "openai", "--out", str(out)]) == 0
    assert [r["id"] for r in aio.read_records(out)] == ["x"]


def test_import_disk_full_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    src = _write(tmp_path / "a.jsonl", json.dumps({"id": "x", "messages": [USER]}) + "\n")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(aio.os, "fsync", full)
    out = tmp_path / "o.jsonl"
    assert main(["import", str(src), "--format", "openai", "--out", str(out)]) == 2
    assert _one_error_line(capsys) == f"attnprobe: error: {out}: no space left on device (disk full)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl"]  # no output, no temp file


# ------------------------------------------------------------------ the boundary itself
def test_interrupt_and_unexpected_errors(tmp_path, capsys, monkeypatch):
    import attnprobe.trajectory.importers as importers

    src = _write(tmp_path / "a.jsonl", json.dumps({"messages": [USER]}) + "\n")
    args = ["import", str(src), "--format", "openai", "--out", str(tmp_path / "o.jsonl")]

    def interrupted(path, fmt):
        raise KeyboardInterrupt

    monkeypatch.setattr(importers, "iter_import", interrupted)
    assert main(args) == 130
    err = capsys.readouterr().err
    assert err == "attnprobe: interrupted; finished results are kept, rerun to resume\n"

    def bug(path, fmt):
        raise TypeError("'NoneType' object is not subscriptable")

    monkeypatch.setattr(importers, "iter_import", bug)
    assert main(args) == 2
    assert _one_error_line(capsys) == ("attnprobe: error: unexpected TypeError: 'NoneType' object is not "
                                       "subscriptable (-v shows the traceback)")
    assert main([*args, "-v"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.rstrip().endswith(
        "attnprobe: error: unexpected TypeError: 'NoneType' object is not subscriptable")


def test_describe_error_names_the_file():
    assert describe_error(OSError(errno.EROFS, "Read-only file system", "/mnt/out/x")) == \
        "/mnt/out/x: read-only file system"
    assert describe_error(PermissionError(errno.EACCES, "Permission denied", "/r/a", None, "/r/b")) == \
        "/r/a -> /r/b: permission denied"
    assert describe_error(IsADirectoryError(errno.EISDIR, "Is a directory", "/d")) == "/d: is a folder, not a file"
    assert describe_error(RecursionError("maximum recursion depth exceeded")) == \
        "input nested too deeply (JSON or messages)"
    assert describe_error(json.JSONDecodeError("Expecting value", "a\nb", 2)) == \
        "invalid JSON (Expecting value at line 2, column 1)"
    assert describe_error(b"\xff".decode("utf-8", "replace") and UnicodeDecodeError("utf-8", b"a\xff", 1, 2, "x")) == \
        "input is not UTF-8 text (byte 1)"
    assert describe_error(KeyError("segments")) == "unexpected KeyError: 'segments'"


# ------------------------------------------------------------------ capture: checked before the model loads
@pytest.fixture
def no_model(monkeypatch):
    def refuse(spec):
        raise AssertionError("the model must not be loaded for an input that is refused")

    monkeypatch.setattr(ModelSpec, "load", refuse)


def test_capture_output_that_cannot_be_written_is_refused_before_any_work(tmp_path, capsys, no_model):
    src = _write(tmp_path / "t.jsonl", json.dumps({"id": "a", "messages": [USER]}) + "\n")
    blocker = _write(tmp_path / "blocker", "a file where the output folder should be")
    assert main(["capture", str(src), "--out", str(blocker)]) == 2
    assert _one_error_line(capsys) == f"attnprobe: error: {blocker}: the output folder is a file, not a folder"
    assert main(["capture", str(src), "--out", str(blocker / "sub")]) == 2
    assert f"{blocker / 'sub'}: the output folder is not writable" in _one_error_line(capsys)


def test_capture_duplicate_ids_and_bad_inputs(tmp_path, capsys, no_model):
    a = _write(tmp_path / "a.jsonl", json.dumps({"id": "x", "messages": [USER]}) + "\n")
    b = _write(tmp_path / "b.jsonl", json.dumps({"id": "x", "messages": [USER]}) + "\n")
    out = tmp_path / "out"
    assert main(["capture", str(a), str(b), "--out", str(out)]) == 2
    assert _one_error_line(capsys) == (f"attnprobe: error: {b}, line 1, field 'id': duplicate trajectory id 'x': "
                                       f"also at {a}, line 1; ids must be unique across all inputs")
    assert not out.exists()
    for bad, expect in [
        (_write(tmp_path / "e.jsonl", ""), "no trajectories in this file (it is empty)"),
        (_write(tmp_path / "u.jsonl", b'{"id": "\xff"}\n'), "line 1: not UTF-8 text (byte 8)"),
        (_write(tmp_path / "d.jsonl", '{"id": "a", "meta": ' + "[" * 20000 + "]" * 20000 + "}\n"),
         "line 1: JSON nested too deeply"),
        (tmp_path, "is a folder, not a JSON Lines file"),
    ]:
        assert main(["capture", str(bad), "--out", str(out)]) == 2
        line = _one_error_line(capsys)
        assert f"{bad}" in line and expect in line, line


def test_convert_output_checked_before_dequantizing(tmp_path, capsys, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("nothing may be converted for an output that cannot be written")

    import importlib

    # (attnprobe.capture is also the name of a function on the package, so no dotted-path setattr)
    monkeypatch.setattr(importlib.import_module("attnprobe.model_convert"), "convert_gguf", refuse)
    blocker = _write(tmp_path / "blocker", "x")
    assert main(["convert", "default", str(blocker)]) == 2
    assert _one_error_line(capsys) == f"attnprobe: error: {blocker}: the output folder is a file, not a folder"
    assert main(["convert", "default", str(blocker / "out")]) == 2
    assert _one_error_line(capsys) == f"attnprobe: error: {blocker}: the folder of the output is a file, not a folder"
