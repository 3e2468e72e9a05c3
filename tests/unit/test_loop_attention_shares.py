"""`study attention`'s numbers on hand-built capture results with known answers (no model), and its
report and errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnprobe.errors import AttnprobeError
from attnprobe.render.segments import QueryPoint, Segment
from attnprobe.results.result import CaptureResult
from attnprobe.studies.loop.attention import CATEGORIES, call_shares, read_study, setting_attention, with_attention

# system, task, the first turn's tool call, its observation (sent as a placeholder), the reply's header and text
SEGMENTS = [Segment("system", "external", 0, 0, 0, 2), Segment("task", "external", 0, 1, 2, 4),
            Segment("tool_call", "self", 0, 2, 4, 6), Segment("observation", "external", 0, 3, 6, 9),
            Segment("template", "external", 1, 4, 9, 10, "template"), Segment("reasoning", "self", 1, 4, 10, 12)]
ROW = [0.1, 0.1, 0.05, 0.05, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.0]


def result(row=ROW, history=True, qid="q1") -> CaptureResult:
    meta = {"question_id": qid}
    if history:  # sent message 3 is full-history message 5, which the policy replaced by a placeholder
        meta["history"] = {"source": [0, 1, 2, 5], "changes": {"5": "placeholder"}}
    rows = np.asarray([row, row], dtype=np.float32)
    return CaptureResult("t", np.arange(12), SEGMENTS, [QueryPoint(10, "reasoning", 1, 4), QueryPoint(11, "decision", 1, 4)],
                         [0], np.zeros((2, len(SEGMENTS))), np.zeros((2, 1, 1, len(SEGMENTS))), rows,
                         meta={"trajectory_meta": meta})


def test_shares_by_category_known_values():
    s = call_shares(result())
    want = {"system": 0.2, "task": 0.1, "past_reasoning": 0.0, "past_tool_call": 0.2, "past_observation": 0.0,
            "placeholder": 0.3, "refined": 0.0, "current_step": 0.2}  # the reply's header opens the reply
    for q in ("reasoning", "decision"):
        assert s[q] == pytest.approx(want, abs=1e-7)
    # without the call's history record, the same tokens are a past observation
    s = call_shares(result(history=False))["decision"]
    assert (s["past_observation"], s["placeholder"]) == (pytest.approx(0.3, abs=1e-7), 0.0)


def test_setting_means_are_per_question_then_over_questions():
    other = [0.0] * 11 + [1.0]  # all on the reply: current step 1
    rs = [result(qid="q1"), result(other, qid="q1"), result(qid="q2")]
    d = setting_attention(rs, n_boot=200)
    assert (d["questions"], d["calls"]) == (2, 3)
    # q1: (0.2 + 1.0) / 2 = 0.6, q2: 0.2 -> 0.4 (not the mean over calls, 1.4 / 3)
    assert d["decision"]["shares"]["current_step"]["mean"] == pytest.approx(0.4, abs=1e-7)
    assert d["decision"]["shares"]["placeholder"]["mean"] == pytest.approx((0.15 + 0.3) / 2, abs=1e-7)
    assert set(d["decision"]["shares"]) == set(CATEGORIES)


def test_study_folder_errors_and_the_report_section(tmp_path):
    with pytest.raises(AttnprobeError, match="not an interference study folder"):
        read_study(tmp_path)
    (tmp_path / "study.json").write_text(json.dumps({"settings": []}))
    with pytest.raises(AttnprobeError, match=r"study.json: field 'settings'"):
        read_study(tmp_path)
    (tmp_path / "study.json").write_text(json.dumps({"settings": {"none": {}, "mask:5": {}}, "baseline": "none"}))
    assert read_study(tmp_path)["settings"] == ["none", "mask:5"]
    head = "# Interference study\n\n| table |\n"
    assert with_attention(head, tmp_path) == head  # nothing to append yet
    (tmp_path / "attention.md").write_text("## Attention per setting (new)\n")
    md = with_attention(head + "\n## Attention per setting (old)\n| stale |\n", tmp_path)
    assert md == head + "\n## Attention per setting (new)\n"
