"""`attnprobe report` keeps going past one bad capture (issue 22): a NaN capture is left out of the
overall numbers and listed (it used to blank every "Overall" number); a capture with an unknown role is
listed as skipped with its file (it used to abort with `unexpected KeyError: 'alien'`); a FIFO in place
of scores.safetensors is refused at once (it used to hang). Other studies add sections through
``extra`` without this module importing them. Hand-built results, no model."""

from __future__ import annotations

import json
import os
import re
import threading

import numpy as np
from support.captures import long_synthetic, synthetic

from attnprobe.results.analysis import headline as headline_of
from attnprobe.results.report import ExtraSection, Section, write_report


def _overall(html: str) -> str:
    return html.split("<h2>Overall</h2>", 1)[1].split("<h3>Skipped", 1)[0]


def test_a_nan_capture_is_left_out_of_the_overall_numbers_and_listed(tmp_path):
    root = tmp_path / "caps"
    long_synthetic("good-1").save(root / "good-1")
    long_synthetic("good-2").save(root / "good-2")
    bad = long_synthetic("nan-1")
    bad.token_attention[0, 3] = np.nan
    bad.save(root / "nan-1")
    html = write_report(root).read_text()
    overall = _overall(html)
    want = headline_of([long_synthetic("good-1"), long_synthetic("good-2")])  # the numbers without the NaN capture
    assert want["steps"] == 2 and abs(want["past_reasoning_share"] - 24 / 56) < 1e-6  # 6 past turns x 4 / 56 tokens
    assert "<th>mean attention to past reasoning</th><td>0.4286</td>" in overall
    assert "<th>mean attention to past observations</th><td>0.4286</td>" in overall
    assert "nan" not in overall.lower()
    assert re.search(r"attnprobe [^;]*; 2 trajectories\.", html)
    assert "<h3>Skipped: 1 unreadable capture folder (not in any number above)</h3>" in html
    assert (f"<tr><th>{root / 'nan-1'}</th><td>{root / 'nan-1'}/scores.safetensors: 1 NaN or infinite value in "
            "token_attention; left out</td>") in html


def test_a_capture_with_an_unknown_role_is_skipped_with_its_file(tmp_path):
    root = tmp_path / "caps"
    synthetic("good").save(root / "good")
    synthetic("alien").save(root / "alien")
    meta_path = root / "alien" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["segments"][3]["role"] = "alien"
    meta_path.write_text(json.dumps(meta))
    html = write_report(root).read_text()
    assert re.search(r"attnprobe [^;]*; 1 trajectory\.", html)
    assert (f"{meta_path}, field &#39;segments[3].role&#39;: unknown role &#39;alien&#39; (expected one of "
            "system, task, reasoning, tool_call, observation, template)") in html


def test_a_fifo_in_place_of_the_scores_does_not_hang(tmp_path):
    root = tmp_path / "caps"
    synthetic("good").save(root / "good")
    synthetic("fifo").save(root / "fifo")
    (root / "fifo" / "scores.safetensors").unlink()
    os.mkfifo(root / "fifo" / "scores.safetensors")
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("out", write_report(root)), daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "report blocked on a FIFO"
    html = box["out"].read_text()
    assert (f"{root / 'fifo' / 'scores.safetensors'}: cannot read scores (is a FIFO (named pipe), not a regular "
            "file)") in html


def test_extra_sections_come_from_the_caller(tmp_path):
    """A folder holding the marker file is handed to the section's builder, not read as a capture."""
    root = tmp_path / "caps"
    synthetic("good").save(root / "good")
    for name in ("s1", "s2"):
        (root / "study" / name).mkdir(parents=True)
        (root / "study" / name / "mine.json").write_text("{}")
    seen = []

    def build(r, folders, skipped):
        seen.extend(folders)
        skipped.append((str(folders[1]), "unreadable on purpose"))
        return Section("Study X", "studyx", "what it shows", [
            {"anchor": "x0", "name": "study", "info": [("folders", len(folders))], "head": ["a", "b"],
             "tables": [("Table one", [("1", "2")])]}])

    html = write_report(root, extra=[ExtraSection("mine.json", build)]).read_text()
    assert seen == [root / "study" / "s1", root / "study" / "s2"]
    assert '<h2 id="studyx">Study X</h2>' in html and "<h4>Table one</h4>" in html
    assert "unreadable on purpose" in html and re.search(r"; 1 trajectory\.", html)
