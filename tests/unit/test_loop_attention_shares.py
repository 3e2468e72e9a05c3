"""`study attention`'s numbers on hand-built capture results with known answers (no model), and its
report and errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnprobe.errors import AttnprobeError
from attnprobe.render.segments import QueryPoint, Segment
from attnprobe.results.result import CaptureResult
from attnprobe.studies.loop.attention import (
    CATEGORIES,
    call_record,
    call_shares,
    kept_records,
    markdown,
    paired_difference,
    read_study,
    relative_share,
    setting_attention,
    with_attention,
)

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
    d = setting_attention(rs, n_boot=200, min_past=1)  # these calls are at step 1 (the reply's turn)
    assert (d["questions"], d["calls"]) == (2, 3)
    # q1: (0.2 + 1.0) / 2 = 0.6, q2: 0.2 -> 0.4 (not the mean over calls, 1.4 / 3)
    assert d["decision"]["shares"]["current_step"]["mean"] == pytest.approx(0.4, abs=1e-7)
    assert d["decision"]["shares"]["placeholder"]["mean"] == pytest.approx((0.15 + 0.3) / 2, abs=1e-7)
    assert set(d["decision"]["shares"]) == set(CATEGORIES)


def test_study_folder_errors_and_the_report_section(tmp_path):
    with pytest.raises(AttnprobeError, match="not an interference study folder"):
        read_study(tmp_path)
    (tmp_path / "study.json").write_text(json.dumps({"settings": []}))
    with pytest.raises(AttnprobeError, match=r"study.json: 'settings' is not an object"):
        read_study(tmp_path)
    (tmp_path / "study.json").write_text(json.dumps({"settings": {"none": {}, "mask:5": {}}, "baseline": "none"}))
    with pytest.raises(AttnprobeError, match=r"study.json: 'results' is missing.*run 'attnprobe study interference'"):
        read_study(tmp_path)  # no stamps of its results (an older attnprobe): the study is run again first
    (tmp_path / "study.json").write_text(json.dumps({"settings": {"none": {}, "mask:5": {}}, "baseline": "none",
                                                     "results": {"none": {}, "mask:5": {}}}))
    assert read_study(tmp_path)["settings"] == ["none", "mask:5"]
    head = "# Interference study\n\n| table |\n"
    assert with_attention(head, tmp_path) == head  # nothing to append yet
    (tmp_path / "attention.md").write_text("## Attention per setting (new)\n")
    md = with_attention(head + "\n## Attention per setting (old)\n| stale |\n", tmp_path)
    assert md == head + "\n## Attention per setting (new)\n"


# ------------------------------------------------------------------ per-token share relative to uniform
def test_relative_share_known_values():
    assert relative_share(0.3, 10, 100) == pytest.approx(3.0)  # 10 of 100 tokens get 30%: three times its length
    assert relative_share(0.1, 10, 100) == pytest.approx(1.0)  # its length's worth
    assert np.isnan(relative_share(0.0, 0, 100))  # no token of the category


def test_relative_share_of_a_captured_call():
    """100 tokens visible to the decision (position 99): system 10 tokens with 30%, task 85 with 60%, the
    reply's header 5 with 10%."""
    segs = [Segment("system", "external", 0, 0, 0, 10), Segment("task", "external", 0, 1, 10, 95),
            Segment("template", "external", 1, 2, 95, 100, "template"), Segment("reasoning", "self", 1, 2, 100, 104)]
    row = np.zeros(104)
    row[:10], row[10:95], row[95:100] = 0.3 / 10, 0.6 / 85, 0.1 / 5
    res = CaptureResult("t", np.arange(104), segs, [QueryPoint(99, "decision", 1, 2)], [0], np.zeros((1, 4)),
                        np.zeros((1, 1, 1, 4)), row[None].astype(np.float32), meta={"trajectory_meta": {"step": 6}})
    rec = call_record(res)
    assert (rec["step"], rec["kind"]) == (5, "reasoning")  # meta.step 6 = the 6th call: 5 past turns
    d = rec["queries"]["decision"]
    assert d["visible"] == 100 and (d["tokens"]["system"], d["tokens"]["task"], d["tokens"]["current_step"]) == (10, 85, 5)
    assert d["relative"]["system"] == pytest.approx(3.0, abs=1e-5)
    assert d["relative"]["task"] == pytest.approx(0.6 / 0.85, abs=1e-5)
    assert d["relative"]["current_step"] == pytest.approx(2.0, abs=1e-5)
    assert np.isnan(d["relative"]["past_observation"])  # no past observation token


# ------------------------------------------------------------------ filters, per step, paired differences
def rec(q, step, kind="reasoning", system=0.1, **shares):
    sh = dict.fromkeys(CATEGORIES, 0.0) | {"system": system} | shares
    one = {"shares": sh, "tokens": dict.fromkeys(CATEGORIES, 1), "visible": 10,
           "relative": {c: v * 10 for c, v in sh.items()}}
    return {"question": q, "step": step, "kind": kind, "queries": {"decision": one} | ({"reasoning": one}
                                                                                       if kind == "reasoning" else {})}


CALLS = [rec("q1", 0), rec("q1", 3, "action"), rec("q1", 2), rec("q1", 5, "action"), rec("q1", 6)]


def test_filter_counts_on_hand_built_calls():
    kept, left = kept_records(CALLS, "decision", 5)
    assert [r["step"] for r in kept] == [5, 6]
    assert left == {"first_call": 1, "action_only": 0, "too_few_past": 2, "not_captured": 0}
    kept, left = kept_records(CALLS, "reasoning", 5)
    assert [r["step"] for r in kept] == [6]
    assert left == {"first_call": 1, "action_only": 2, "too_few_past": 1, "not_captured": 0}
    kept, left = kept_records(CALLS, "reasoning", 0)  # no filter on past turns: first calls count too
    assert [r["step"] for r in kept] == [0, 2, 6] and left["first_call"] == 0 and left["action_only"] == 2


def test_per_step_table_and_left_out_counts_in_the_setting_numbers():
    calls = CALLS + [rec("q2", 6, system=0.3)]
    d = setting_attention([], n_boot=100, min_past=5, records=calls)
    assert d["reasoning"]["left_out"] == {"first_call": 1, "action_only": 2, "too_few_past": 1, "not_captured": 0}
    assert (d["reasoning"]["calls"], d["reasoning"]["questions"]) == (2, 2)
    assert d["reasoning"]["shares"]["system"]["mean"] == pytest.approx(0.2)  # (0.1 + 0.3) / 2 questions
    assert d["reasoning"]["relative"]["system"]["mean"] == pytest.approx(2.0)
    by = d["reasoning"]["by_step"]  # reasoning replies only, first call included
    assert {k: v["calls"] for k, v in by.items()} == {"0": 1, "2": 1, "6": 2}
    assert by["6"]["shares"]["system"] == pytest.approx(0.2)
    assert set(d["decision"]["by_step"]) == {"0", "2", "3", "5", "6"}


def test_paired_difference_known_values_and_pairing():
    """Pairs at the same (question, step): q1 steps 5 and 6 (+0.1, -0.1: mean 0), q2 step 5 (+0.2); q1's step 7
    and q3 have no partner. Per question 0.0 and 0.2 -> mean 0.1; the paired bootstrap over 2 questions draws
    {0, 0.1, 0.2} with 1/4, 1/2, 1/4: the 95% interval is [0, 0.2]."""
    base = [rec("q1", 5, system=0.1), rec("q1", 6, system=0.3), rec("q2", 5, system=0.1), rec("q3", 5, system=0.1)]
    sett = [rec("q1", 5, system=0.2), rec("q1", 6, system=0.2), rec("q1", 7, system=0.9), rec("q2", 5, system=0.3),
            rec("q3", 4, system=0.5)]
    p = paired_difference(sett, base, "decision", min_past=5, n_boot=2000)
    assert (p["pairs"], p["questions"], p["unpaired"]) == (3, 2, {"setting": 1, "baseline": 1})
    d = p["difference"]["system"]
    assert (d["mean"], d["lo"], d["hi"]) == (pytest.approx(0.1), pytest.approx(0.0, abs=1e-12), pytest.approx(0.2))
    assert p["difference"]["task"]["mean"] == 0.0
    same = paired_difference(base, base, "decision", min_past=5, n_boot=200)["difference"]["system"]
    assert (same["mean"], same["lo"], same["hi"]) == (0.0, 0.0, 0.0)
    assert "difference" not in paired_difference(sett, [], "decision", min_past=5)


def test_markdown_shows_every_table():
    calls = {"none": CALLS + [rec("q2", 6)], "mask:1": [rec("q1", 6, system=0.2), rec("q2", 6, system=0.4)]}
    settings = {}
    for s, rs in calls.items():
        settings[s] = {"recorded_calls": len(rs), "captured_calls": len(rs), "capture_folder": "x",
                       **setting_attention([], n_boot=100, min_past=5, records=rs)}
    settings["mask:1"]["paired"] = {q: paired_difference(calls["mask:1"], calls["none"], q, min_past=5, n_boot=100)
                                    for q in ("decision", "reasoning")}
    doc = {"baseline": "none", "settings": settings, "min_past": 5, "capture": {"model": "m"}, "study_models": [],
           "bootstrap": {"resamples": 100}}
    md = markdown(doc)
    assert "none: 1 first call, 2 action only, 1 too few past, 0 not captured" in md
    # paired at (q1, 6) and (q2, 6): system +0.1 and +0.3 -> +20 pp [+10, +30]; the baseline's (q1, 5) unpaired
    assert "| mask:1 | 2 (2) | 0 / 1 | +20.0 [+10.0, +30.0] pp |" in md
    assert "| none | 6 | 2 | 10.0 |" in md  # the per-step table: step 6 of the baseline, two calls, 10% system


# ------------------------------------------------------------------ issue 37: paired per-token shares, tables with numbers
def test_paired_difference_of_per_token_shares_beside_the_raw_one():
    """The per-token share of these records is 10x the share (10 tokens visible, 1 per category), so the paired
    per-token difference of the pairs above is 10x theirs: q1 (+1, -1) -> 0, q2 +2 -> mean 1.0, CI [0, 2]. A pair
    where one side has no token of a category (NaN) is left out of that category only."""
    base = [rec("q1", 5, system=0.1), rec("q1", 6, system=0.3), rec("q2", 5, system=0.1)]
    sett = [rec("q1", 5, system=0.2), rec("q1", 6, system=0.2), rec("q2", 5, system=0.3)]
    p = paired_difference(sett, base, "decision", min_past=5, n_boot=2000)
    d = p["relative_difference"]["system"]
    assert (d["mean"], d["lo"], d["hi"]) == (pytest.approx(1.0), pytest.approx(0.0, abs=1e-9), pytest.approx(2.0))
    sett[1]["queries"]["decision"]["relative"] = {**sett[1]["queries"]["decision"]["relative"], "system": float("nan")}
    d = paired_difference(sett, base, "decision", min_past=5, n_boot=200)["relative_difference"]["system"]
    assert d["mean"] == pytest.approx((1.0 + 2.0) / 2)  # q1 keeps only its step-5 pair (+1); q2 +2
    assert p["difference"]["system"]["mean"] == pytest.approx(0.1)  # the raw one unchanged beside it


def _doc(calls, min_past, **extra):
    settings = {}
    for s, rs in calls.items():
        settings[s] = {"recorded_calls": len(rs), "captured_calls": len(rs), "capture_folder": "x",
                       **setting_attention([], n_boot=100, min_past=min_past, records=rs)}
    settings["mask:1"]["paired"] = {q: paired_difference(calls["mask:1"], calls["none"], q, min_past=min_past,
                                                         n_boot=100) for q in ("decision", "reasoning")}
    return {"baseline": "none", "settings": settings, "min_past": min_past, "capture": {"model": "m"},
            "study_models": [], "bootstrap": {"resamples": 100}, **extra}


def test_per_step_table_first_when_the_filter_kept_nothing_and_structured_actions_in_the_title():
    calls = {"none": [rec("q1", 0), rec("q1", 1), rec("q2", 2)], "mask:1": [rec("q1", 1, system=0.2), rec("q2", 2)]}
    md = markdown(_doc(calls, 5, structured_actions=True, max_past_turns=2))
    assert md.splitlines()[0] == ("## Attention per setting (attnprobe study attention), structured actions "
                                  "(--structured-actions: constrained decoding, not the seeds' free decoding)")
    section = md.split("### Decision token")[1].split("### ")[0]
    tables = [line for line in section.splitlines() if line.endswith(":") and not line.startswith("Left out")]
    assert tables[0].startswith("Per step") and "No call has 5 or more past turns" in section
    assert "| none | 1 | 1 | 10.0 |" in section.split("Attention share")[0]  # numbers before the first n/a table
    assert "this study's calls have at most 2" in md
    # the per-token paired table is there, its cells n/a like the others
    assert "Paired difference of per-token shares relative to uniform with none" in section
    # with calls the filter keeps: shares first, per step last, no structured words
    md = markdown(_doc(calls, 1))
    section = md.split("### Decision token")[1].split("### ")[0]
    tables = [line for line in section.splitlines() if line.endswith(":") and not line.startswith("Left out")]
    assert tables[0].startswith("Attention share") and tables[-1].startswith("Per step")
    assert "structured actions" not in md.splitlines()[0]
    # paired per-token at (q1, 1) and (q2, 2): system 2.0 - 1.0 and 1.0 - 1.0 -> +0.50
    assert "| mask:1 | 2 (2) | +0.50 [+0.00, +1.00] |" in section


@pytest.mark.parametrize(("config", "most", "default"), [
    ({"scaffold": "ircot", "max_turns": 4, "final_call": True}, 4, 4),     # the default ircot study: 4, not 5
    ({"scaffold": "ircot", "max_turns": 4, "final_call": False}, 3, 3),
    ({"scaffold": "ircot", "max_turns": 8}, 8, 5),                         # seed 002 E.5's five when reachable
    ({"scaffold": "seed002", "max_turns": 5}, 4, 4),
    ({"scaffold": "seed002", "max_turns": 50}, 49, 5),
    ({"scaffold": "ircot", "max_turns": 1}, 1, 1),
    ({}, None, 5),
])
def test_default_past_turn_filter_is_one_the_turn_limit_can_meet(config, most, default):
    from attnprobe.studies.loop.attention_report import default_shares_min_past, max_past_turns

    assert max_past_turns(config) == most and default_shares_min_past(config) == default
