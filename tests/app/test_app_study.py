"""The Study page and its data layer on a hand-built study folder with known numbers (tests/support/studydir.py):
the side-by-side table, the paired comparison, the outcome grid, one question's steps per setting with their
policy flags and captures, and the refusals (corrupt study.json, anything outside the data directory). No model."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from support.studydir import BASE, OTHER, call_id, make_study

from attnprobe.io import safe_name
from attnprobe.studies.loop.layout import StudyLayout
from attnprobe_app import data as D
from attnprobe_app import shaping as SH
from attnprobe_app import study_data as SD

OTHER_DIR = "study/mask-1_refine-bm25-a01c95f0"  # slug of OTHER: ':' -> '-', '+' hashed by safe_name


@pytest.fixture
def data(tmp_path) -> Path:
    root = tmp_path / "data"
    make_study(root / "study")
    return root.resolve()


def _study(root: Path) -> SD.Study:
    inv = D.discover(root)
    studies, problems = SD.load_studies(root, inv.studies)
    assert problems == [] and [s.rel for s in studies] == ["study"]
    return studies[0]


def test_the_scan_finds_the_study_and_the_table_has_its_numbers(data):
    study = _study(data)
    assert study.settings == [BASE, OTHER] and study.baseline == BASE
    assert study.setting_rel(OTHER) == OTHER_DIR and (data / OTHER_DIR).is_dir()
    rows = {r["setting"]: r for r in SD.settings_table(study)}
    base, other = rows["none (baseline)"], rows[OTHER]
    # none: q1 right, q2 no answer; tool calls / retrievals 1 and 3; tokens (calls + 1) x 100 in, x 10 out
    assert base == {"setting": "none (baseline)", "n": 2, "EM (%)": "50.0 [0.0, 100.0]", "ART": "2.00 [1.00, 3.00]",
                    "tool calls": "2.0 [1.0, 3.0]", "Len. (tokens)": "50.0 [50.0, 50.0]",
                    "rolling input tokens": "300.0 [200.0, 400.0]", "output tokens": "30.0 [20.0, 40.0]",
                    "AIT (s)": "1.5 [1.5, 1.5]", "no answer": 1}
    assert other["EM (%)"] == "100.0 [100.0, 100.0]" and other["ART"] == "1.00 [1.00, 1.00]"
    assert other["rolling input tokens"] == "200.0 [200.0, 200.0]" and other["no answer"] == 0
    [paired] = SD.paired_table(study)
    assert paired == {"setting": OTHER, "questions": 2, "fixed": 1, "broken": 0,
                      "difference (points) [95% CI]": "+50.0 [+0.0, +100.0]", "McNemar exact p": "1",
                      "fixed questions": "q2", "broken questions": ""}
    grid = {r["question"]: r for r in SD.outcome_grid(study)}
    assert (grid["q1"][BASE], grid["q1"][OTHER]) == ("correct", "correct")
    assert (grid["q2"][BASE], grid["q2"][OTHER]) == ("no answer", "correct")
    assert grid["q2"]["fixed by"] == OTHER and grid["q2"]["broken by"] == ""
    assert SD.outcome(False, "Rome") == "wrong" and SD.outcome(None, "x") == "not scored"
    assert SD.outcome(None, None, ran=False) == "not run"


def test_steps_come_in_order_with_policy_flags_and_their_captures(data):
    study = _study(data)
    got = SD.question_steps(data, study, OTHER, "q1")
    assert [s.step for s in got.steps] == [1, 2, 3]  # the file holds 2, 1, 3
    assert [s.call_id for s in got.steps] == [call_id(OTHER, "q1", k) for k in (1, 2, 3)]
    s1, s2, s3 = got.steps
    assert (s1.sent, s1.history_messages, s3.sent, s3.history_messages) == (2, 2, 6, 6)
    assert s3.changes == {"placeholder": [3], "removed": [], "calls_removed": [], "refined": [5]}
    assert s3.policy == "placeholder: 3; refined: 5" and s2.policy == "nothing changed"
    assert s1.tool_calls == ['search({"query": "capital"})'] and s3.reply == "Exact Answer: Paris"
    assert (s3.input_tokens, s3.output_tokens) == (120, 5)
    assert got.capture_folder
    # step 3: its own capture; step 2: none; step 1: a folder of another trajectory is not this call's
    assert s3.capture == f"{OTHER_DIR}/capture/{safe_name(s3.call_id)}" and s3.capture_note == "captured"
    assert D.load_capture(data, s3.capture).trajectory_id == s3.call_id
    assert (s2.capture, s2.capture_note) == (None, "no capture")
    assert s1.capture is None and s1.capture_note == "capture folder holds trajectory 'someone-else', not this call"
    assert got.problems == [f"{OTHER_DIR}/capture/{safe_name(s1.call_id)}: holds trajectory 'someone-else', "
                            f"not call '{s1.call_id}'"]
    base = SD.question_steps(data, study, BASE, "q1")  # no capture folder at all: behaviour only, no error
    assert [s.step for s in base.steps] == [1, 2] and not base.capture_folder and base.problems == []
    assert all(s.capture is None and s.capture_note == "no capture" for s in base.steps)
    missing = SD.question_steps(data, study, BASE, "q2")
    assert missing.steps == [] and missing.problems == ["study/none: no recorded calls of question q2"]


def test_corrupt_or_malformed_study_json_is_skipped_with_a_message(data):
    (data / "broken").mkdir()
    (data / "broken" / "study.json").write_text('{"settings": ')
    (data / "odd").mkdir()
    (data / "odd" / "study.json").write_text('{"settings": {"none": {"accuracy": "high"}}, "baseline": "none"}')
    (data / "nobase").mkdir()
    (data / "nobase" / "study.json").write_text('{"settings": {"none": {}}, "baseline": "other"}')
    inv = D.discover(data)
    assert inv.studies == ["broken", "nobase", "odd", "study"]
    studies, problems = SD.load_studies(data, inv.studies)
    assert [s.rel for s in studies] == ["study"]
    assert problems[0].startswith("skipped: broken/study.json") and len(problems) == 3
    assert problems[1:] == ["skipped: nobase/study.json: 'baseline' 'other' is not one of the settings",
                            "skipped: odd/study.json: 'settings.none.accuracy' is 'high', not a finite number"]


def test_nothing_outside_the_data_directory_is_read(tmp_path, data):
    outside = make_study(tmp_path / "elsewhere" / "study")
    os.symlink(outside, data / "linked")  # a symlinked study folder: not followed by the scan
    assert D.discover(data).studies == ["study"]
    with pytest.raises(D.PathEscapeError, match="outside the data directory"):
        SD.load_study(data, "linked")
    with pytest.raises(D.PathEscapeError):
        SD.load_study(data, str(outside))
    (data / "leak").mkdir()  # a study.json that is a symlink to one outside
    os.symlink(outside / "study.json", data / "leak" / "study.json")
    studies, problems = SD.load_studies(data, D.discover(data).studies)
    assert [s.rel for s in studies] == ["study"] and "outside the data directory" in problems[0]
    # a calls file and a capture linked from outside are refused, not read
    study = _study_of(data)
    calls = StudyLayout(data / "study").setting_dir(BASE) / "calls" / "q1.jsonl"
    calls.unlink()
    os.symlink(StudyLayout(outside).setting_dir(BASE) / "calls" / "q1.jsonl", calls)
    got = SD.question_steps(data, study, BASE, "q1")
    assert got.steps == [] and "outside the data directory" in got.problems[0]
    escaped = SD.question_steps(data, study, BASE, "../../../../elsewhere/study/none/calls/q1")
    assert escaped.steps == [] and "outside the data directory" in escaped.problems[0]


def _study_of(root: Path) -> SD.Study:
    return SD.load_study(root, "study")


def _page(monkeypatch, data: Path, page: str):
    """The app on ``data`` at ``page``, drawn once, with no exception (Streamlit's AppTest)."""
    from streamlit.testing.v1 import AppTest
    from support.appdata import APP_FILE

    monkeypatch.setenv("ATTNPROBE_APP_DATA", str(data))
    at = AppTest.from_file(APP_FILE, default_timeout=60)
    at.query_params["page"] = page
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


# ------------------------------------------------------------------ the page
def test_study_page_renders_the_known_numbers_steps_and_heatmap(monkeypatch, data):
    pytest.importorskip("streamlit")
    from support.appdata import charts, decode, is_heatmap, md_tables

    at = _page(monkeypatch, data, "Study")
    assert at.title[0].value == "Study: policies in the loop"
    rn = (f"setting {OTHER} retrieved nothing: no observation held a passage (none in any of its 3 recorded calls; "
          "2 retrievals over 2 questions); whatever differs from the baseline comes from what the policy wrote in "
          "place of empty observations, not from retrieved text")  # no passage: issue 37
    assert [w.value for w in at.warning] == [f"Caveat: {rn}", f"Caveat: {N_CAVEAT}"]  # computed from the data
    frames = md_tables(at)  # the small tables are Markdown (app/common.py table); the grid is a dataframe
    table = frames[0]
    assert list(table["setting"]) == ["none (baseline)", OTHER]
    assert list(table["EM (%)"]) == ["50.0 [0.0, 100.0]", "100.0 [100.0, 100.0]"]
    assert list(table["tool calls"]) == ["2.0 [1.0, 3.0]", "1.0 [1.0, 1.0]"]
    assert frames[1].iloc[0]["difference (points) [95% CI]"] == "+50.0 [+0.0, +100.0]"
    grid = at.dataframe[0].value.set_index("question")  # the grids: questions, then each setting's steps
    assert grid.loc["q2", BASE] == "no answer" and grid.loc["q2", OTHER] == "correct"
    # q1, baseline + the other setting side by side: the baseline has no captures (says how to make them)
    base_steps, other_steps = at.dataframe[1].value, at.dataframe[2].value
    assert list(base_steps["step"]) == [1, 2] and list(other_steps["step"]) == [1, 2, 3]
    # what the policy did comes first (full-history message indices), so it is visible without scrolling
    assert list(other_steps.columns[:4]) == ["step", "placeholder", "refined", "removed"]
    assert list(other_steps["placeholder"]) == ["–", "–", "3"] and list(other_steps["refined"]) == ["–", "–", "5"]
    assert list(other_steps["capture"])[1:] == ["no capture", "captured"]
    infos = [i.value for i in at.info]
    assert any(f"attnprobe study attention {data}/study`" in i and f"{data}/study/none/calls.jsonl" in i
               for i in infos)
    assert not any("attention.json" in e.label for e in at.expander)  # no attention.json
    cs = charts(at)
    assert sum(is_heatmap(c) for c in cs) == 1  # only step 3 was captured
    hm = next(c for c in cs if is_heatmap(c))
    assert decode(hm["data"][0]["z"]).shape == (3, 3)
    seg = next(c for c in cs if c["data"] and c["data"][0].get("type") == "bar")
    by_cat = {t["name"]: decode(t["x"]) for t in seg["data"]}  # one stacked bar per query: attention.md's categories
    assert list(seg["data"][0]["y"]) == ["reasoning"]  # the toy capture's one query of the reply
    # the query (token 11) weights token k by (k + 1) / 78: turn 0's observation (tokens 6-7) was the
    # placeholder (meta.history.changes); attention.md's categories, as call_shares counts them (issue 37): system
    # tokens 0-1 (3/78), task 2-3 (7/78), past reasoning 4-5 and 8-9 (30/78), turn 1's observation (token 10,
    # 11/78: refined in the history's list, not in its changes, which call_shares reads), current step 11 (12/78)
    want = {"system": 3, "task": 7, "past reasoning": 30, "past tool call": 0, "past observation": 11,
            "placeholder": 15, "refined": 0, "current step": 12}
    assert list(by_cat) == list(want)
    np.testing.assert_allclose([by_cat[c][0] for c in want], [v / 78 for v in want.values()], atol=1e-6)
    # the heatmap: sequential scales from 0 (white); ticks say which turn was replaced
    for t in hm["data"]:
        assert t["zmin"] == 0 and t["colorscale"][0][1] == "#ffffff"
    assert hm["layout"]["yaxis"]["ticktext"] == ["0 (placeholder)", "1 (refined)", "2"]
    assert any(c.value == SH.ROLE_LEGEND for c in at.caption)
    at.radio(key="study_attention").set_value("none").run()
    assert not at.exception and charts(at) == [] and len(at.dataframe) == 3  # the steps stay, the figures go


def test_per_call_views_name_both_models_when_the_capture_model_is_not_the_agents(monkeypatch, data):
    """Step 3 of q1 under the other setting was captured by toy-model (its meta.json). Recorded by toy-model:
    the heatmap title and the bars' caption name no model; recorded by another agent model: both name the two
    models, as study attention's tables do."""
    pytest.importorskip("streamlit")
    assert SD.call_models_label("toy-model", "toy-model") is None and SD.call_models_label("toy-model", None) is None
    assert SD.call_models_label("SmolLM2-135M", "Qwen2.5-7B") == "capture model SmolLM2-135M, agent model Qwen2.5-7B"

    def titles(at):
        return [m.value for m in at.markdown if "Turn heatmap of step" in m.value] + \
            [c.value for c in at.caption if c.value.startswith("Attention of the call's")]

    at = _page(monkeypatch, data, "Study")
    assert titles(at) and not any("capture model" in t for t in titles(at))
    calls = data / OTHER_DIR / "calls" / "q1.jsonl"
    recs = [json.loads(line) for line in calls.read_text().splitlines()]
    calls.write_text("".join(json.dumps({**r, "model": "agent-7b"}) + "\n" for r in recs))
    at = _page(monkeypatch, data, "Study")
    got = titles(at)
    assert got[0] == "**Turn heatmap of step 3** (2 past turns; capture model toy-model, agent model agent-7b)"
    assert len(got) == 2 and "heads; capture model toy-model, agent model agent-7b. [Open in Trajectory]" in got[1]
    # the Trajectory page, opened on that capture (the Study page's link), says it too; a capture outside a
    # study, or of a call recorded by the capture model, does not
    from streamlit.testing.v1 import AppTest
    from support.appdata import APP_FILE

    rel = f"{OTHER_DIR}/capture/{safe_name(call_id(OTHER, 'q1', 3))}"

    def trajectory_warnings():
        at = AppTest.from_file(APP_FILE, default_timeout=60)
        at.query_params.update(page="Trajectory", run=rel)
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        return [w.value for w in at.warning]

    assert trajectory_warnings() == ["capture model toy-model, agent model agent-7b: the attention shown is another "
                                     "model's reading of the agent's context"]
    calls.write_text("".join(json.dumps(r) + "\n" for r in recs))  # recorded by toy-model again
    assert trajectory_warnings() == []
    assert SD.capture_agent_model(data, "captures/x", "t", {"trajectory_meta": {"question_id": "q1"}}) is None


N_CAVEAT = "n = 2: intervals are not informative (95% bootstrap CIs over fewer than 10 questions)"


def test_study_caveats_of_the_study_and_its_attention_json(data):
    """The page's caveats: study.json's (2 questions per setting) and, once written, attention.json's (here
    calls with injected system text and calls left out by the past-turn filter); a bad attention.json adds
    none (the page reports it with the tables)."""
    from attnprobe.studies.loop.attention_report import results_stamps

    study = _study(data)
    # the hand-built calls hold no passage (step 3's placeholder is an edit, not a retrieval): issue 37
    rn = (f"setting {OTHER} retrieved nothing: no observation held a passage (none in any of its 3 recorded calls; "
          "2 retrievals over 2 questions); whatever differs from the baseline comes from what the policy wrote in "
          "place of empty observations, not from retrieved text")
    assert SD.study_caveats(data, study) == [rn, N_CAVEAT]
    doc = {"min_past": 5, "results_stamps": results_stamps(study.data["results"]), "settings": {"none": {"captured_calls": 4, "injected_system": {"calls": 4, "min_tokens": 21,
                                                                                         "max_tokens": 21},
                                                "decision": {"questions": 12, "left_out": {"first_call": 2}}}}}
    (data / "study" / "attention.json").write_text(json.dumps(doc))
    assert SD.study_caveats(data, study) == [
        rn, N_CAVEAT, "system includes the chat template's injected text (21 tokens): 4 captured calls sent no system "
                  "message, so their system share is the template's default system text and the first token (the "
                  "attention sink)",
        "2 steps excluded by the past-turn filter (fewer than 5 past turns, --shares-min-past; seed 002 E.5): none "
        "2 of 4"]
    (data / "study" / "attention.json").write_text(json.dumps({**doc, "results_stamps": {"none": "older"}}))
    assert SD.study_caveats(data, study) == [rn, N_CAVEAT]  # computed from other results: not shown, nor its caveats
    (data / "study" / "attention.json").write_text('{"settings": ')
    assert SD.study_caveats(data, study) == [rn, N_CAVEAT]
    assert SD.models_label({"capture": {"capture_model": "SmolLM2-135M-Instruct", "agent_model": "Qwen2.5-7B"}}) == \
        "capture model SmolLM2-135M-Instruct, agent model Qwen2.5-7B"  # the page's attention heading says it
    assert SD.models_label({"capture": {"capture_model": "m", "agent_model": "m"}}) is None


def test_attention_summary_is_optional_and_a_bad_one_is_an_error_not_a_crash(data):
    study = _study(data)
    assert SD.attention_summary(data, study) is None  # not written yet: behaviour only
    (data / "study" / "attention.json").write_text('{"settings": {"none": {"observation": 0.25}}}')
    assert SD.attention_summary(data, study) == {"settings": {"none": {"observation": 0.25}}}
    with pytest.raises(D.DataError, match="unexpected layout"):  # the page shows this, then the raw file
        SD.attention_rows(SD.attention_summary(data, study), "decision")
    (data / "study" / "attention.json").write_text('{"settings": ')
    with pytest.raises(D.DataError, match=r"^study/attention.json"):
        SD.attention_summary(data, study)


def test_study_page_lists_a_corrupt_study_json_and_says_how_to_make_one(monkeypatch, tmp_path):
    pytest.importorskip("streamlit")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "study.json").write_text('{"settings": ')
    at = _page(monkeypatch, tmp_path, "Study")
    assert [e.label for e in at.expander] == ["1 file(s) skipped"]
    assert [t.value for t in at.text] == ["skipped: broken/study.json, line 1: invalid JSON (Expecting value at "
                                          "column 14)"]
    assert "No interference studies found" in at.info[0].value and "attnprobe study interference" in at.info[0].value


def _attention_doc() -> dict:
    """An attention.json as `attnprobe study attention` writes it (no results_stamps): the settings none and mask:1."""
    from attnprobe.studies.loop.attention import CATEGORIES

    def shares(first):
        return {c: {"mean": first if i == 0 else 0.0, "lo": first - 0.01 if i == 0 else 0.0,
                    "hi": first + 0.01 if i == 0 else 0.0} for i, c in enumerate(CATEGORIES)}

    return {"settings": {
        "none": {"recorded_calls": 4, "captured_calls": 4, "tokens_per_call": 337.2,
                 "decision": {"calls": 3, "questions": 2, "shares": shares(0.456), "relative": shares(2.5),
                              "visible_tokens": 300.0,
                              "by_step": {"5": {"calls": 2, "shares": dict.fromkeys(CATEGORIES, 0.0) | {"system": 0.5}}}},
                 "reasoning": {"calls": 0, "questions": 2}},
        "mask:1": {"recorded_calls": 3, "captured_calls": 0, "tokens_per_call": None,
                   "decision": {"calls": 0, "questions": 0}, "reasoning": {"calls": 0, "questions": 0},
                   "paired": {"decision": {"pairs": 0, "questions": 0, "unpaired": {"setting": 0, "baseline": 3}}}}}}


def test_attention_rows_print_the_shares_of_attention_json():
    """attention.json (as `attnprobe study attention` writes it) as the page's per-setting table: the
    shares as attention.md prints them, "n/a" for a setting without captures, a malformed file refused."""
    doc = _attention_doc()
    rows = SD.attention_rows(doc, "decision")
    assert [r["setting"] for r in rows] == ["none", "mask:1"]
    assert rows[0]["calls used / captured / recorded"] == "3 / 4 / 4" and rows[0]["tokens per call"] == "337"
    assert rows[0]["system"] == "45.6 [44.6, 46.6]" and rows[0]["current step"] == "0.0 [0.0, 0.0]"
    assert rows[1]["system"] == "n/a" and rows[1]["tokens per call"] == "n/a" and rows[1]["questions"] == 0
    assert SD.attention_rows(doc, "reasoning")[0]["system"] == "n/a"
    rel = SD.attention_rows(doc, "decision", "per-token share relative to uniform")
    assert (rel[0]["tokens seen"], rel[0]["system"], rel[1]["system"]) == ("300", "2.50 [2.49, 2.51]", "n/a")
    paired = SD.attention_rows(doc, "decision", "paired difference with the baseline")
    assert [(r["setting"], r["unpaired setting / baseline"], r["system"]) for r in paired] == [("mask:1", "0 / 3", "n/a")]
    assert [(r["setting"], r["step"], r["calls"]) for r in SD.attention_rows(doc, "decision", "per step")] == \
        [("none", 5, 2)]
    with pytest.raises(D.DataError, match="unexpected layout"):
        SD.attention_rows({"settings": {"none": {"decision": {}}}}, "decision")


def test_trajectory_and_decay_pages_keep_a_studys_calls_apart_and_show_placeholders(monkeypatch, data):
    """A study's per-call capture: off the Trajectory picker and the Decay page by default (a checkbox brings
    them back); opened by folder, its replaced messages are placeholder / refined, not observations."""
    pytest.importorskip("streamlit")
    from support.appdata import charts, decode, is_heatmap

    at = _page(monkeypatch, data, "Trajectory")
    assert not [s for s in at.selectbox if s.key == "traj_run"]  # nothing offered: only a study's calls exist
    at.checkbox(key="traj_studies").check().run()
    [picker] = [s for s in at.selectbox if s.key == "traj_run"]
    assert len(picker.options) == 2 and all(o.startswith("study study · ") for o in picker.options)
    rel = f"{OTHER_DIR}/capture/{safe_name(call_id(OTHER, 'q1', 3))}"
    at.text_input(key="traj_path").set_value(rel).run()
    assert not at.exception, [e.value for e in at.exception]
    cs = charts(at)
    bars = next(c for c in cs if c["data"] and c["data"][0].get("type") == "bar" and
                "turn %{x}" in c["data"][0].get("hovertemplate", ""))
    by_role = {t["name"]: decode(t["y"]) for t in bars["data"]}
    assert "observation" not in by_role and set(by_role) >= {"placeholder", "refined"}
    hm = next(c for c in cs if is_heatmap(c))
    assert hm["layout"]["yaxis"]["ticktext"] == ["0 (placeholder)", "1 (refined)", "2"]
    assert any("A context policy changed this call's history: 2 message(s) replaced, 0 removed" in c.value
               for c in at.caption)
    decay = _page(monkeypatch, data, "Decay")
    assert "include studies' per-call captures" in decay.info[0].value


def _md(at) -> str:
    return "\n".join(m.value for m in at.markdown)


def _not_caveats(at) -> list[str]:
    return [w.value for w in at.warning if not w.value.startswith("Caveat: ")]


def test_study_page_drops_an_attention_json_computed_from_other_results(monkeypatch, data):
    """The rule study.md applies (attention_report.stale_reason): an attention.json stamped with study.json's
    results is drawn; once a rerun changed a setting's results (study.json's stamps), or with no stamp at all,
    the page shows study.md's line instead of the old numbers, and leaves out attention.json's caveats."""
    pytest.importorskip("streamlit")
    from attnprobe.studies.loop.attention_report import results_stamps

    folder = data / "study"
    study_json = json.loads((folder / "study.json").read_text())
    doc = {**_attention_doc(), "min_past": 5, "results_stamps": results_stamps(study_json["results"])}
    (folder / "attention.json").write_text(json.dumps(doc))
    assert SD.attention_dropped(data, _study(data), doc) is None
    at = _page(monkeypatch, data, "Study")
    assert "| none | 0\\.0 \\[0\\.0, 0\\.0\\] |" in _md(at) and "45\\.6 \\[44\\.6, 46\\.6\\]" in _md(at)
    assert _not_caveats(at) == []
    study_json["results"]["none"]["q1"] = "stamp-q1-rerun"  # q1 reran under none (its gold answer changed)
    (folder / "study.json").write_text(json.dumps(study_json))
    os.utime(folder / "study.json", (1, 1))  # another mtime whatever the clock's resolution
    line = (f"Dropped: the results of none changed since it ran; run 'attnprobe study attention {data}/study' "
            "again for the attention of the current results.")
    assert SD.attention_dropped(data, _study(data), doc) == line
    at = _page(monkeypatch, data, "Study")
    assert "45\\.6" not in _md(at) and _not_caveats(at) == [line]
    assert "Attention per setting" in [h.value for h in at.subheader]
    (folder / "attention.json").write_text(json.dumps(_attention_doc()))  # no stamp (an older attnprobe)
    assert SD.attention_dropped(data, _study(data), _attention_doc()) == (
        "Dropped: attention.json records no stamp of the results it used; run 'attnprobe study attention "
        f"{data}/study' again for the attention of the current results.")


def test_study_page_shows_one_line_for_attention_json_numbers_given_as_text(monkeypatch, data):
    """An attention.json whose numbers are strings (tokens per call "337.2", a share's mean "0.456"): one error
    line on the page, the rest of the page drawn, no exception."""
    pytest.importorskip("streamlit")
    from attnprobe.studies.loop.attention_report import results_stamps

    folder = data / "study"
    doc = {**_attention_doc(), "results_stamps": results_stamps(json.loads((folder / "study.json").read_text())
                                                                ["results"])}
    doc["settings"]["none"]["tokens_per_call"] = "337.2"
    (folder / "attention.json").write_text(json.dumps(doc))
    at = _page(monkeypatch, data, "Study")
    assert [e.value for e in at.error] == [
        "Cannot show the attention summary: attention.json: unexpected layout (ValueError: Unknown format code 'f' "
        "for object of type 'str')"]
    assert "Per question" in [h.value for h in at.subheader]
    doc["settings"]["none"]["tokens_per_call"] = 337.2
    doc["settings"]["none"]["decision"]["shares"]["system"]["mean"] = "0.456"
    with pytest.raises(D.DataError, match=r"^attention.json: unexpected layout \(TypeError"):
        SD.attention_rows(doc, "decision")
