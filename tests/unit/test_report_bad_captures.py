"""`attnprobe report` and CaptureResult over broken capture folders (issue 13, items 4, 9, 10, 11):
one unreadable capture is skipped and listed, never aborts the report; oversized meta.json is not read;
dot-folders are not results; variants are reported apart. Hand-built results, no model."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.captures import synthetic

from attnprobe.cli.main import main
from attnprobe.errors import AttnprobeError
from attnprobe.results.report import find_results, write_report
from attnprobe.results.result import CaptureResult


def test_report_skips_and_lists_unreadable_captures(tmp_path, caplog, monkeypatch):
    root = tmp_path / "caps"
    synthetic("good-1").save(root / "good-1")
    synthetic("good-2", dtype="bfloat16").save(root / "run" / "good-2")
    (root / "corrupt").mkdir()
    (root / "corrupt" / "meta.json").write_text('{"trajectory_id": "c", ')
    synthetic("noscores").save(root / "noscores")
    (root / "noscores" / "scores.safetensors").unlink()
    (root / "huge").mkdir()
    with open(root / "huge" / "meta.json", "wb") as fh:  # sparse 600 MB: must not be read
        fh.write(b'{"trajectory_id": "h", "format_version": 1, "x": "')
        fh.truncate(600 * 1024 * 1024)
    shutil.copytree(root / "good-1", root / ".good-1.tmp-k2x9q7z1")  # left by a killed save
    shutil.copytree(root / "good-1", root / ".hidden" / "good-1")
    (root / "other").mkdir()
    (root / "other" / "meta.json").write_text('{"name": "another tool"}')  # not ours: passed over quietly
    read = []
    import attnprobe.io.json as iojson
    real = iojson.read_regular_bytes

    def reading(path, *args):  # records the folders whose meta.json was actually read
        data = real(path, *args)
        read.append(Path(path).parent.name)
        return data

    monkeypatch.setattr(iojson, "read_regular_bytes", reading)
    with caplog.at_level("WARNING"):
        out = write_report(root)
    assert "huge" not in read and {"good-1", "good-2", "corrupt", "noscores"} <= set(read)
    html = out.read_text()
    assert re.search(r"attnprobe [^;]*; 2 trajectories\.", html)
    assert "<h3>M (float32, transformers, weights abcdef01)</h3>" in html  # variants are never pooled
    assert "<h3>M (bfloat16, transformers, weights abcdef01)</h3>" in html
    assert "<h3>Skipped: 3 unreadable capture folders (not in any number above)</h3>" in html
    reasons = {
        "corrupt": "meta.json, line 1: invalid JSON (Expecting property name enclosed in double quotes at column 24)",
        "huge": "meta.json: 629145600 bytes, above the limit of 67108864 bytes; not read",
        "noscores": "scores.safetensors: cannot read scores",
    }
    for folder, reason in reasons.items():
        assert f"<tr><th>{root / folder}</th><td>{root / folder}/{reason}" in html
        assert f"skipping {root / folder}/{reason}" in caplog.text
    assert "report written without 3 unreadable capture folder(s)" in caplog.text
    assert "another tool" not in caplog.text
    assert ".good-1.tmp-" not in html and str(root / ".hidden") not in html


def test_find_results_never_enters_dot_folders(tmp_path):
    synthetic("a").save(tmp_path / "a")
    for hidden in (".a.tmp-x1", ".a.old-y2", ".git/a", ".cache/deep/a"):
        shutil.copytree(tmp_path / "a", tmp_path / hidden)
    assert find_results(tmp_path) == [tmp_path / "a"]


def test_report_with_nothing_readable_is_one_line(tmp_path, capsys):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "meta.json").write_bytes(b"\xff\xfe")
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == (f"attnprobe: skipping {tmp_path / 'c' / 'meta.json'}, line 1: not UTF-8 text (byte 0)\n"
                   f"attnprobe: error: {tmp_path}: no readable capture results found; 1 unreadable: "
                   f"{tmp_path / 'c' / 'meta.json'}, line 1: not UTF-8 text (byte 0)\n")
    assert main(["report", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == f"attnprobe: error: {tmp_path / 'none'}: folder not found\n"
    synthetic("a").save(tmp_path / "a")
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "a")]) == 2
    assert capsys.readouterr().err.endswith(f"attnprobe: error: {tmp_path / 'a'}: the report file is a folder\n")


@pytest.mark.parametrize("edit,message", [
    (lambda m: m.pop("segments"), "field 'segments': malformed (KeyError: 'segments')"),
    (lambda m: m.update(segments=[{"role": "reasoning"}]), "field 'segments': malformed (TypeError"),
    (lambda m: m.update(queries=5), "field 'queries': malformed (TypeError"),
    (lambda m: m.pop("trajectory_id"), "field 'trajectory_id / layers / score arrays': malformed (KeyError"),
    (lambda m: m.update(format_version=7), "unsupported format_version 7"),
])
def test_malformed_meta_is_an_error_naming_file_and_field(tmp_path, edit, message):
    synthetic("a").save(tmp_path / "a")
    meta_path = tmp_path / "a" / "meta.json"
    meta = json.loads(meta_path.read_text())
    edit(meta)
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(AttnprobeError) as info:
        CaptureResult.load(tmp_path / "a")
    assert str(info.value).startswith(str(meta_path)) and message in str(info.value)


def test_save_writes_strict_json_and_shared_files(tmp_path):
    res = synthetic("a", labels={"score": math.nan, "ok": 1.5})
    res.save(tmp_path / "a")
    raw = (tmp_path / "a" / "meta.json").read_text()
    assert "NaN" not in raw
    assert json.loads(raw)["labels"] == {"score": None, "ok": 1.5}
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in (tmp_path / "a").iterdir()}
    assert modes == {"meta.json": "0o644", "text.json": "0o644", "scores.safetensors": "0o644"}
    back = CaptureResult.load(tmp_path / "a")
    np.testing.assert_array_equal(back.segment_attention, res.segment_attention)
    assert back.turn_role_attention()[1, 1].tolist() == pytest.approx([0, 0, 0.3, 0, 0.4, 0])
