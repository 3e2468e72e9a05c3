"""Options and outputs are refused while parsing or before any model loads (issue 22): bounded integer
lists, limits >= 1, finite temperatures, non-negative token limits, ports; `run`'s output checked and
locked (a second run into one --out is refused in one line, so records are never duplicated). No model."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

import attnprobe.cli.options as options
from attnprobe.capture.models import ModelSpec
from attnprobe.cli.main import main


def _refused_while_parsing(capsys, argv: list[str], words: str) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and words in err, err
    return err


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*args, **kw):
        raise AssertionError("the model must not be loaded for options that are refused")

    monkeypatch.setattr(ModelSpec, "load", refuse)
    monkeypatch.setattr(options, "make_generator", refuse)


@pytest.mark.parametrize("argv, words", [
    (["run", "--out", "o.jsonl", "--limit", "0"], "argument --limit: must be at least 1, got 0"),
    (["run", "--out", "o.jsonl", "--limit", "-1"], "argument --limit: must be at least 1, got -1"),
    (["run", "--out", "o.jsonl", "--temperature", "nan"], "must be a finite number >= 0, got 'nan'"),
    (["run", "--out", "o.jsonl", "--temperature", "inf"], "must be a finite number >= 0, got 'inf'"),
    (["run", "--out", "o.jsonl", "--temperature", "-0.5"], "must be a finite number >= 0"),
    (["run", "--out", "o.jsonl", "--max-new-tokens", "-5"], "argument --max-new-tokens: must be at least 1, got -5"),
    (["run", "--out", "o.jsonl", "--max-tokens", "-5"], "must be at least 1, got -5"),  # its old name
    (["run", "--out", "o.jsonl", "--manager-steps", "-1"], "argument --manager-steps: must be 0 or more"),
    (["capture", "t.jsonl", "--out", "o", "--max-tokens", "-1"], "argument --max-tokens: must be at least 1"),
    (["capture", "t.jsonl", "--out", "o", "--layers", "3-1"], "range '3-1' runs backwards"),
    (["capture", "t.jsonl", "--out", "o", "--layers", "-1"], "not a list of integers >= 0"),
    (["capture", "t.jsonl", "--out", "o", "--layers", "1,x"], "(at 'x')"),
    (["app", "--data", ".", "--port", "99999"], "argument --port: port must be 0-65535, got 99999"),
    (["app", "--data", ".", "--port", "9" * 5000], "expected a port number"),
])
def test_bad_options_are_refused_while_parsing(capsys, argv, words):
    _refused_while_parsing(capsys, argv, words)


def test_a_huge_range_is_refused_before_it_is_expanded(capsys):
    t0 = time.perf_counter()
    _refused_while_parsing(capsys, ["capture", "t.jsonl", "--out", "o", "--layers", "0-1000000000"],
                           f"'0-1000000000' names more than {options.MAX_LIST_ITEMS} values")
    assert time.perf_counter() - t0 < 5  # was a MemoryError after filling memory
    assert options.parse_int_list("0-3,7, 9-9") == [0, 1, 2, 3, 7, 9]
    assert options.parse_int_list("all") is None


def test_app_port_in_use_is_one_line_naming_host_and_port(tmp_path, capsys, monkeypatch):
    import attnprobe.cli.app as app

    monkeypatch.setattr(app, "run_child", lambda cmd, env: pytest.fail("streamlit must not start"))
    if app.importlib.util.find_spec("streamlit") is None:
        pytest.skip("needs the [app] extra")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["app", "--data", str(tmp_path), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"attnprobe: error: 127.0.0.1:{port}: address already in use (another server is "
                           "listening there; choose another --port, or --port 0 for any free one)")


QUESTIONS = '{"id": "q1", "question": "Who?", "answer": "x"}\n'

HOLDER = textwrap.dedent("""
    import sys, time
    from attnprobe.io import hold_file_lock
    with hold_file_lock(sys.argv[1], "output of attnprobe run"):
        print("held", flush=True)
        time.sleep(60)
""")


def test_run_into_an_output_in_use_is_refused_before_the_model_loads(tmp_path, capsys, no_model):
    """Two concurrent runs into one --out wrote 24 call records for 12 calls: now the second is refused."""
    q = tmp_path / "q.jsonl"
    q.write_text(QUESTIONS)
    out = tmp_path / "runs" / "x.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ))
    try:
        assert proc.stdout.readline().strip() == "held"
        assert main(["run", str(q), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"attnprobe: error: {out.parent}: the output of attnprobe run x.jsonl is in use by "
                              f"process {proc.pid} on ") and "\n" not in err, err
    finally:
        proc.kill()
        proc.wait()
    assert not out.exists()


def test_run_output_checked_before_the_model_loads(tmp_path, capsys, no_model):
    q = tmp_path / "q.jsonl"
    q.write_text(QUESTIONS)
    folder = tmp_path / "a-folder"
    folder.mkdir()
    assert main(["run", str(q), "--out", str(folder)]) == 2
    assert f"{folder}: the output file (--out) is a folder" in capsys.readouterr().err
    out = tmp_path / "o.jsonl"
    out.write_text(json.dumps({"id": "old"}) + "\n")
    assert main(["run", str(q), "--out", str(out)]) == 2
    assert "already has records: pass --resume" in capsys.readouterr().err
    assert main(["run", str(q), "--out", str(out), "--resume", "--force"]) == 2
    assert "--resume and --force exclude each other" in capsys.readouterr().err
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        assert main(["run", str(q), "--out", str(ro / "x.jsonl")]) == 2
        assert "not writable" in capsys.readouterr().err


def test_strict_json_inputs_are_refused_with_file_line_and_key(tmp_path, capsys, no_model):
    """Duplicate keys used to be decided silently (the last one won); NaN was written back out."""
    dup = tmp_path / "t.jsonl"
    dup.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi", "content": "bye"}]}\n')
    assert main(["capture", str(dup), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == (f"attnprobe: error: {dup}, line 1: invalid JSON: duplicate key "
                                               "'content' (a key may appear once per object)")
    q = tmp_path / "q.jsonl"
    q.write_text('{"id": "q1", "question": "Who?", "answer": NaN}\n')
    assert main(["run", str(q), "--out", str(tmp_path / "r.jsonl")]) == 2
    assert f"{q}, line 1: invalid JSON: NaN is not a JSON number" in capsys.readouterr().err
    src = tmp_path / "in.jsonl"
    src.write_text('{"messages": [{"role": "user", "content": "x"}], "answer": Infinity}\n')
    assert main(["import", str(src), "--format", "openai", "--out", str(tmp_path / "imp.jsonl")]) == 2
    assert "invalid JSON: Infinity is not a JSON number" in capsys.readouterr().err
    assert not (tmp_path / "imp.jsonl").exists()
