"""The app's data layer over one bad capture (issue 22): NaN scores, an unknown role and a FIFO in place
of scores.safetensors each become one DataError naming the folder and the reason (listed by the pages),
never a traceback, a hang or a NaN on a page. Hand-built captures, no model, no Streamlit."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest
from support.captures import long_synthetic

from attnprobe_app.data import DataError, discover, load_capture


def _within(fn, seconds: float = 20):
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("r", _call(fn)), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "blocked"
    if isinstance(box["r"], BaseException):
        raise box["r"]
    return box["r"]


def _call(fn):
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001 - handed back to the test
        return exc


def test_bad_captures_are_data_errors_naming_folder_and_reason(tmp_path):
    root = tmp_path / "data"
    long_synthetic("good").save(root / "good")
    nan = long_synthetic("nan")
    nan.token_attention[0, :3] = np.nan
    nan.save(root / "nan")
    long_synthetic("alien").save(root / "alien")
    meta = json.loads((root / "alien" / "meta.json").read_text())
    meta["segments"][2]["role"] = "alien"
    (root / "alien" / "meta.json").write_text(json.dumps(meta))
    long_synthetic("fifo").save(root / "fifo")
    (root / "fifo" / "scores.safetensors").unlink()
    os.mkfifo(root / "fifo" / "scores.safetensors")

    inv = _within(lambda: discover(root.resolve()))
    assert sorted(c.rel for c in inv.captures) == ["alien", "fifo", "good", "nan"]  # listed from meta.json
    assert load_capture(root.resolve(), "good").trajectory_id == "good"
    with pytest.raises(DataError, match=r"^nan: inconsistent capture: token_attention holds 3 NaN or infinite "
                                        r"values \(left out of every number\)$"):
        load_capture(root.resolve(), "nan")
    with pytest.raises(DataError, match=r"alien/meta.json, field 'segments\[2\].role': unknown role 'alien'"):
        load_capture(root.resolve(), "alien")
    with pytest.raises(DataError, match=r"fifo/scores.safetensors: cannot read scores \(is a FIFO"):
        _within(lambda: load_capture(root.resolve(), "fifo"))


def test_a_wrongly_typed_study_json_is_skipped_and_the_others_shown(tmp_path):
    """Issue 27: one study.json with `config`, `bootstrap` or `models` of the wrong type took the Study page
    down for every study (its label and header call .get() and iterate them); now each is skipped with
    one line and the good study keeps its label."""
    from support.studydir import make_study

    from attnprobe_app import study_data as SD

    root = tmp_path / "data"
    make_study(root / "good")
    bad = {"config": "seed002", "bootstrap": [2000], "models": 3, "scorer": ["em"], "questions_total": "two"}
    for key, value in bad.items():
        make_study(root / key)
        path = root / key / "study.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))
    root = root.resolve()
    studies, problems = SD.load_studies(root, discover(root).studies)
    assert [s.label for s in studies] == ["good · seed002 · toy-model · 2 settings"]
    assert problems == ["skipped: bootstrap/study.json: 'bootstrap' is list, not an object",
                        "skipped: config/study.json: 'config' is str, not an object",
                        "skipped: models/study.json: 'models' is int, not a list",
                        "skipped: questions_total/study.json: 'questions_total' is 'two', not a number",
                        "skipped: scorer/study.json: 'scorer' is list, not a string"]
