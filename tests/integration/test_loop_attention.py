"""`attnprobe study attention`: the attention side of an interference study, on a study made with scripted
replies (seed002 over the shipped BM25 corpus) and captured with the bundled model (the session fixture:
loaded once). Values are checked against what the capture files hold, computed another way."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support.interference import run_interference as run_study
from support.scripted_chat import ScriptedChat, tool_call

from attnprobe.capture.job import CaptureOptions
from attnprobe.cli.main import main
from attnprobe.counterfactual.run import RunOptions
from attnprobe.execution.local import LocalExecutor
from attnprobe.render.segments import ROLES
from attnprobe.results.analysis import step_masses
from attnprobe.results.report import find_results
from attnprobe.results.result import CaptureResult
from attnprobe.studies.loop.agents import LoopConfig
from attnprobe.studies.loop.attention import CATEGORIES, QUERIES, call_shares, call_step
from attnprobe.studies.loop.attention_study import run_attention

pytestmark = pytest.mark.slow  # captures with the bundled model (one load per session)

R = {r: i for i, r in enumerate(ROLES)}
QUESTIONS = [{"id": "q1", "question": "Who discovered holmium?", "answers": ["Per Teodor Cleve"], "type": None},
             {"id": "q2", "question": "What is two plus two?", "answers": ["4"], "type": None}]
QUERIES_Q1 = ["holmium", "Cleve", "Uppsala"]
FINAL = "Explanation: known.\nExact Answer: 4\nConfidence: 90%"
LAYERS = [0, 1, 2]


def script(messages, tools):
    """q1: three turns of reasoning plus one search each, then an answer (4 calls; its steps at turns 2 and 3
    have >= 2 past turns); q2: answers at once (1 call)."""
    turns = sum(m["role"] == "assistant" for m in messages)
    if "two plus two" in messages[1]["content"] or turns >= len(QUERIES_Q1):
        return FINAL
    return f"<think>Step {turns}: search again.</think>", [tool_call(f"c{turns}", "search", query=QUERIES_Q1[turns])]


@pytest.fixture(scope="module")
def study(tmp_path_factory, tiny_smol):
    smol = tiny_smol  # the tiny random-weight SmolLM2: same tokenizer and template; no bundled number is pinned
    """The study (scripted), then its attention side: (out, counts, doc, counts of the rerun, doc of it)."""
    out = tmp_path_factory.mktemp("attn") / "study"
    cfg = LoopConfig("seed002", max_turns=8, top_k=1)
    counts, _ = run_study(LocalExecutor(lambda: ScriptedChat(script), progress=False), out, QUESTIONS,
                          ["none", "mask:1"], cfg, n_boot=100)
    assert counts["failed"] == 0
    ex = LocalExecutor(lambda: smol, progress=False)
    cf = RunOptions(layers=LAYERS)  # what the CLI's options give: the chunk chosen for the device (its rerun below resumes)
    cap = CaptureOptions(queries="reasoning+decision", layers=LAYERS)
    first = run_attention(ex, out, model=smol, capture=cap, counterfactual=cf, min_past=2, shares_min_past=1,
                          n_boot=200)
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("meta.json")}
    again = run_attention(ex, out, model=smol, capture=cap, counterfactual=cf, min_past=2, shares_min_past=1,
                          n_boot=200)
    return out, first, again, stamps


def _calls(out, folder):
    return [json.loads(x) for x in (out / folder / "calls.jsonl").read_text().splitlines()]


def test_every_recorded_call_is_captured_once(study):
    out, (counts, doc), _, _ = study
    for setting, folder in (("none", "none"), ("mask:1", "mask-1")):
        n = len(_calls(out, folder))
        assert n == 5  # q1: 4 calls, q2: 1
        assert len(find_results(out / folder / "capture")) == n
        d = doc["settings"][setting]
        assert (d["recorded_calls"], d["captured_calls"], d["questions"]) == (n, n, 2)
    assert counts == {"done_before": 0, "done": 10, "failed": 0}


def test_every_captured_decision_is_the_reasoning_start_minus_one(study):
    """Issue 26 item 2: the decision of a recorded call is the last token before its reply (every reply of
    this script opens with text, so each is a reasoning reply)."""
    out, *_ = study
    n = 0
    for folder in ("none", "mask-1"):
        for p in find_results(out / folder / "capture"):
            res = CaptureResult.load(p)
            reply = max(s.message_index for s in res.segments)
            dec = [q for q in res.queries if q.kind == "decision"]
            start = [q for q in res.queries if q.kind == "reasoning" and q.message_index == reply]
            assert len(dec) == len(start) == 1 and dec[0].position == start[0].position - 1, p
            assert dec[0].message_index == reply
            n += 1
    assert n == 10


def test_shares_sum_to_one_and_placeholders_are_where_the_policy_put_them(study):
    out, *_ = study
    for folder in ("none", "mask-1"):
        for p in find_results(out / folder / "capture"):
            res = CaptureResult.load(p)
            assert np.allclose(res.token_attention.sum(axis=1), 1.0, atol=1e-5)
            shares = call_shares(res)
            assert set(shares) == set(QUERIES)
            step = res.meta["trajectory_meta"]["step"]
            for q, s in shares.items():
                assert sum(s.values()) == pytest.approx(1.0, abs=1e-5)
                # the setting's contexts only: a placeholder exactly where mask:1 left older observations
                n_masked = max(0, step - 2) if folder == "mask-1" and res.meta["trajectory_meta"]["question_id"] == "q1" \
                    else 0
                assert (s["placeholder"] > 0) == (n_masked > 0), (folder, step, q)
                assert s["refined"] == 0.0
                # the same row through the seed-002 step masses: observations (raw + placeholder) agree
                kind = ("decision",) if q == "decision" else ("reasoning", "action")
                turns, mass = step_masses(res, kinds=kind)
                k = -1  # the reply's reasoning start is the last of its kind; the decision is the only one
                t = int(turns[k])
                assert s["past_observation"] + s["placeholder"] == pytest.approx(mass[k][:t, R["observation"]].sum(),
                                                                                 abs=1e-12)
                assert s["system"] == pytest.approx(mass[k][:, R["system"]].sum(), abs=1e-12)
                assert s["task"] == pytest.approx(mass[k][:, R["task"]].sum(), abs=1e-12)


def test_table_means_equal_the_means_of_the_capture_files(study):
    out, (_, doc), _, _ = study
    paired: dict[tuple, dict] = {}
    for setting, folder in (("none", "none"), ("mask:1", "mask-1")):
        by_q: dict[str, list[dict]] = {}
        for p in find_results(out / folder / "capture"):
            res = CaptureResult.load(p)
            if call_step(res) < 1:  # --shares-min-past 1: the first calls (q1's and q2's) are left out
                continue
            by_q.setdefault(res.meta["trajectory_meta"]["question_id"], []).append(call_shares(res))
            paired[(setting, res.meta["trajectory_meta"]["question_id"], call_step(res))] = call_shares(res)
        for q in QUERIES:
            assert doc["settings"][setting][q]["left_out"] == {"first_call": 2, "action_only": 0, "too_few_past": 0,
                                                               "not_captured": 0}
            assert {k: v["calls"] for k, v in doc["settings"][setting][q]["by_step"].items()} == \
                {"0": 2, "1": 1, "2": 1, "3": 1}
        for q in QUERIES:
            for c in CATEGORIES:
                want = np.mean([np.mean([s[q][c] for s in calls]) for calls in by_q.values()])
                got = doc["settings"][setting][q]["shares"][c]
                assert got["mean"] == pytest.approx(want, abs=1e-9)
                assert np.isnan(got["lo"]) and np.isnan(got["hi"])  # one question (q1) kept: no interval
    # the placeholder column is zero for the baseline and not for the masking setting
    assert doc["settings"]["none"]["decision"]["shares"]["placeholder"]["mean"] == 0.0
    assert doc["settings"]["mask:1"]["decision"]["shares"]["placeholder"]["mean"] > 0.0
    # paired with the baseline at q1's steps 1-3 (one question): the mean of the three differences
    for q in QUERIES:
        p = doc["settings"]["mask:1"]["paired"][q]
        assert (p["pairs"], p["questions"], p["unpaired"]) == (3, 1, {"setting": 0, "baseline": 0})
        for c in CATEGORIES:
            want = np.mean([paired[("mask:1", "q1", k)][q][c] - paired[("none", "q1", k)][q][c] for k in (1, 2, 3)])
            assert p["difference"][c]["mean"] == pytest.approx(want, abs=1e-9)
    assert "paired" not in doc["settings"]["none"]


def test_counterfactuals_at_the_baselines_steps(study):
    out, (_, doc), _, _ = study
    assert "counterfactual" not in doc["settings"]["none"]
    rep = doc["settings"]["mask:1"]["counterfactual"]
    # q1's full history: its 3rd and 4th assistant messages are the steps with >= 2 past turns; q2 has none
    assert (rep["status"], rep["steps"], rep["min_past"]) == ("ran", 2, 2)
    steps = sorted(p.parent.name for p in (out / "mask-1" / "counterfactual").rglob("record.json"))
    assert len(steps) == 2
    s = rep["summary"]["mask:1"]
    assert s["steps"] == 2 and s["steps_changed"] == 2 and s["decision"]["removed_mass"]["mean"] > 0
    md = (out / "study.md").read_text()
    assert md.startswith("# Interference study") and "## Attention per setting" in md and "**mask:1**: 2 steps" in md


def test_a_rerun_does_nothing(study):
    out, _, (counts, doc), stamps = study
    assert counts == {"done_before": 10, "done": 0, "failed": 0}
    assert doc["settings"]["mask:1"]["counterfactual"]["counts"] == {"done_before": 2, "done": 0, "failed": 0}
    assert {p: p.stat().st_mtime_ns for p in out.rglob("meta.json")} == stamps


def test_default_min_past_is_the_counterfactual_commands_and_no_eligible_step_is_reported(study, tiny_smol):
    smol = tiny_smol
    out, *_ = study
    ex = LocalExecutor(lambda: smol, progress=False)
    cap = CaptureOptions(queries="reasoning+decision", layers=LAYERS)
    cf = RunOptions(layers=LAYERS)
    _, doc = run_attention(ex, out, model=smol, capture=cap, counterfactual=cf, n_boot=50, only=["mask:1"])
    # mask:K's default is K + 1 past turns, the first step at which it can archive (issue 26 item 9): for
    # mask:1 that is 2, the fixture's --min-past, so its two steps (q1, turns 2 and 3) are already done
    rep = doc["settings"]["mask:1"]["counterfactual"]
    assert (rep["min_past"], rep["steps"], rep["folder"]) == (2, 2, "mask-1/counterfactual")
    assert rep["counts"] == {"done_before": 2, "done": 0, "failed": 0}
    assert {r["trajectory_id"] for r in map(json.loads, map(Path.read_text, (out / "mask-1" / "counterfactual")
                                                             .rglob("record.json")))} == {"none/q1/history"}
    assert (out / "mask-1" / "counterfactual" / "summary.md").read_text().startswith("Steps with >= 2 past turns.")
    assert list(doc["settings"]) == ["mask:1"]
    # a --min-past beyond the longest history: no eligible step, reported
    _, doc = run_attention(ex, out, model=smol, capture=cap, counterfactual=cf, min_past=5, n_boot=50,
                           only=["mask:1"])
    assert doc["settings"]["mask:1"]["counterfactual"]["min_past"] == 5
    assert doc["settings"]["mask:1"]["counterfactual"]["status"] == "no eligible step (none with >= 5 past turns)"
    assert "- **mask:1**: no eligible step" in (out / "study.md").read_text()


def test_cli(study, tiny_smol_folder, tmp_path, capsys):
    out, *_ = study
    # the study's agent is a scripted chat (no weights): the capture model is asked for, and named as another
    assert main(["study", "attention", str(out), "--layers", "0-2", "--min-past", "2", "--no-progress",
                 "--bootstrap", "50", "--shares-min-past", "3",
                 "--model", str(tiny_smol_folder)]) == 0  # everything resumed: nothing is captured again
    assert json.loads((out / "attention.json").read_text())["capture"]["agent_model"] == "scripted-chat"
    assert json.loads((out / "attention.json").read_text())["settings"]["none"]["decision"]["calls"] == 1  # q1 step 3
    assert (out / "attention.json").is_file() and (out / "attention.md").is_file()
    assert "**mask:1**: 2 steps with >= 2 past turns (0 run, 2 already done" in capsys.readouterr().out
    # issue 29: the counterfactual folder's summary.md names both models (another capture model than the agent's)
    assert (out / "mask-1" / "counterfactual" / "summary.md").read_text().startswith(
        "Steps with >= 2 past turns.\n\nCapture model tiny-smollm2, agent model scripted-chat: ")
    assert main(["study", "attention", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"attnprobe: error: {tmp_path / 'missing'}: not an interference study folder (no study.json); "
                   f"make one with 'attnprobe study interference QUESTIONS --out {tmp_path / 'missing'}'"]
