"""The caveats computed from a study's data (attnprobe/results/caveats.py) and the capture model of
`study attention` (attnprobe/studies/loop/capture_model.py): each caveat on hand-built data that triggers it
(known counts) and on data that does not; a study made against a served model is refused without --model
and, with another --model, every output names both models. No model is loaded."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
from support.studydir import make_study

from attnprobe.io.settings import SETTINGS_FILE
from attnprobe.render.segments import QueryPoint, Segment
from attnprobe.results import caveats as CV
from attnprobe.results.result import CaptureResult
from attnprobe.studies.loop.attention import call_record, injected_system_tokens, setting_attention
from attnprobe.studies.loop.layout import StudyLayout

GREEDY = "its row equals the baseline by construction"
# with recorded calls: the policy may have edited empty observations, so no claim of equality (issue 37)
FROM_EDITS = ("; whatever differs from the baseline comes from what the policy wrote in place of empty "
              "observations, not from retrieved text")


# ------------------------------------------------------------------ retrieved nothing
def test_retrieved_nothing_names_exactly_the_settings_with_art_zero():
    """Without recorded calls the caveat falls back to ART 0, with the retrieval count in the text."""
    settings = {"none": {"questions": 3, "art": 0.0}, "mask:5": {"questions": 3, "art": 0.0},
                "ircot:o": {"questions": 3, "art": 1.5}, "mask:1": {"questions": 0, "art": None}}
    assert CV.retrieved_nothing(settings, "none", temperature=0.0) == [
        f"setting mask:5 retrieved nothing: no policy acted (0 retrievals over 3 questions); {GREEDY}"]
    assert CV.retrieved_nothing(settings, "none", temperature=1.0) == [
        "setting mask:5 retrieved nothing: no policy acted (0 retrievals over 3 questions); its row differs from "
        "the baseline only by sampling (temperature 1)"]  # not the baseline, not unrun mask:1
    settings["mask:5"]["art"] = 1 / 3  # one retrieval on one of 3 questions: the policy could act
    assert CV.retrieved_nothing(settings, "none", temperature=0.0) == []


SYS, USER = {"role": "system", "content": "sys"}, {"role": "user", "content": "question?"}
REPLY = {"role": "assistant", "content": "Exact Answer: Paris"}
SEARCH = {"role": "assistant", "content": "", "tool_calls": [{"id": "call1", "type": "function",
                                                              "function": {"name": "search", "arguments": "{}"}}]}


def _tool(text: str) -> dict:
    return {"role": "tool", "tool_call_id": "call1", "name": "search", "content": text}


def _info(inner: str) -> dict:  # IRCoT's documents: a user message labelled observation, tags included
    block = f"<information>{inner}</information>"
    return {"role": "user", "content": block, "annotations": [{"start": 0, "end": len(block), "role": "observation",
                                                               "author": "external"}]}


def _rec(*sent: dict, history: dict | None = None) -> dict:
    return {"id": "c", "messages": [*sent, REPLY], "meta": {"history": history or {"changes": {}, "refined": []}}}


def test_has_observation_reads_what_the_policy_could_act_on():
    assert CV.has_observation(_rec(SYS, USER, SEARCH, _tool("[0] Paris (https://p)\nParis is the capital.")))
    assert CV.has_observation(_rec(USER, _info("Doc 1(Title: Paris) Paris is the capital.")))
    # a retrieval that returned nothing, a failed call, an empty IRCoT block: nothing to act on
    assert not CV.has_observation(_rec(SYS, USER, SEARCH, _tool("No results for 'capital'.")))
    assert not CV.has_observation(_rec(SYS, USER, SEARCH, _tool("Error: search needs a non-empty 'query'.")))
    assert not CV.has_observation(_rec(USER, _info("  \n")))
    assert not CV.has_observation(_rec(USER, {"role": "user", "content": "<information>x</information>"}))  # unlabelled
    # the reply (last message) is not sent; a history the policy changed means it acted
    assert not CV.has_observation({"messages": [USER, _tool("Paris is the capital.")]})
    # whatever a policy edited: a change alone is no observation, and a placeholder is no passage
    assert not CV.has_observation(_rec(SYS, USER, history={"changes": {"3": "removed"}, "refined": []}))
    ph = {"role": "user", "content": "[Observation omitted to save context.]",
          "annotations": [{"start": 0, "end": 38, "role": "observation", "author": "external"}]}
    masked = {"source": [0, 1, 2], "changes": {"2": "placeholder"}, "refined": []}
    assert not CV.has_observation(_rec(USER, _info(""), ph, history=masked))  # mask:1 over empty blocks
    assert CV.has_observation(_rec(USER, _info("Doc 1 Paris"), ph, history=masked))  # the kept one holds a passage
    assert CV.has_observation(_rec(USER, ph, history={"source": [0, 1], "changes": {}, "refined": []}))  # unedited
    assert CV.observed_calls([_rec(USER), _rec(USER, _info("doc")), "junk"]) == (1, 2)


def _write_calls(root, setting: str, records: list[dict]) -> None:
    folder = StudyLayout(root).setting_dir(setting)
    for f in (folder / "calls").glob("*.jsonl"):
        f.unlink()
    (folder / "calls.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_retrieved_nothing_from_the_recorded_calls_of_a_hand_built_study(tmp_path):
    """The setting mask:1+refine:bm25 made retrievals (ART 1 over 2 questions) but every search returned nothing:
    no call held an observation, so the caveat holds (with the retrieval count); one call with a document and
    it does not. The app's reading of the folder (calls.jsonl, else calls/*.jsonl) decides the same."""
    from support.studydir import BASE, OTHER

    from attnprobe_app import data as D
    from attnprobe_app import study_data as SD

    root = (tmp_path / "data").resolve()
    make_study(root / "study")
    study = json.loads((root / "study" / "study.json").read_text())
    [loaded], _ = SD.load_studies(root, D.discover(root).studies)
    n_caveat = "n = 2: intervals are not informative (95% bootstrap CIs over fewer than 10 questions)"
    # calls/q1.jsonl: step 3 masked message 3 (a placeholder) and no sent message is a passage: an edit is not acting
    edited = (f"setting {OTHER} retrieved nothing: no observation held a passage (none in any of its 3 recorded "
              f"calls; 2 retrievals over 2 questions){FROM_EDITS}")
    assert SD.study_caveats(root, loaded) == [edited, n_caveat]
    empty = [_rec(SYS, USER), _rec(SYS, USER, SEARCH, _tool("No results for 'capital'."))]
    _write_calls(root / "study", OTHER, empty)
    caveat = (f"setting {OTHER} retrieved nothing: no observation held a passage (none in any of its 2 recorded "
              f"calls; 2 retrievals over 2 questions){FROM_EDITS}")
    assert CV.study_caveats(study, {OTHER: empty}) == [caveat, n_caveat]
    assert SD.study_caveats(root, loaded) == [caveat, n_caveat]
    found = [*empty, _rec(SYS, USER, SEARCH, _tool("[0] Paris (https://p)\nParis is the capital."))]
    _write_calls(root / "study", OTHER, found)
    assert CV.study_caveats(study, {OTHER: found}) == [n_caveat]
    assert SD.study_caveats(root, loaded) == [n_caveat]
    # ART 0 but a setting whose calls held an observation (an open without a search): the policy could act
    study["settings"][OTHER]["art"] = 0.0
    assert CV.study_caveats(study, {OTHER: found, BASE: empty}) == [n_caveat]  # the baseline never gets it
    assert CV.study_caveats(study)[0].startswith(f"setting {OTHER} retrieved nothing")  # no calls: ART decides


def test_baseline_never_searched_from_art():
    settings = {"none": {"questions": 3, "art": 0.0}, "ircot:o": {"questions": 3, "art": 0.0}}
    line = ("the baseline none never searched (0 retrievals over 3 questions): its agent answered without "
            "retrieving, so no setting's difference from it is a policy's effect on retrieved text")
    assert CV.baseline_never_searched(settings, "none") == [line]
    assert CV.study_caveats({"baseline": "none", "settings": settings, "config": {"temperature": 0.0}})[:2] == [
        line, f"setting ircot:o retrieved nothing: no policy acted (0 retrievals over 3 questions); {GREEDY}"]
    settings["none"]["art"] = 0.5
    assert CV.baseline_never_searched(settings, "none") == []
    assert CV.baseline_never_searched({"none": {"questions": 0, "art": None}}, "none") == []


def test_study_caveats_on_the_hand_built_study(tmp_path):
    study = json.loads((make_study(tmp_path / "s") / "study.json").read_text())
    # two questions per setting, both settings retrieved (ART 2 and 1): only the n caveat
    assert CV.study_caveats(study) == ["n = 2: intervals are not informative (95% bootstrap CIs over fewer than "
                                       "10 questions)"]
    study["settings"]["mask:1+refine:bm25"]["art"] = 0.0
    study["config"]["temperature"] = 0.0
    assert CV.study_caveats(study)[0] == ("setting mask:1+refine:bm25 retrieved nothing: no policy acted (0 "
                                          f"retrievals over 2 questions); {GREEDY}")
    for m in study["settings"].values():
        m["questions"] = 12
    assert CV.study_caveats(study) == [CV.study_caveats(study)[0]]


def test_study_md_and_json_carry_the_caveats(tmp_path):
    """A scripted IRCoT study whose agent answers at once: no setting retrieves, so ircot:o's policy never
    acted (greedy: its row is the baseline's); 3 questions. One that searches first: only the n caveat."""
    from support.scripted_chat import ScriptedChat

    from attnprobe.execution.local import LocalExecutor
    from attnprobe.studies.loop.agents import LoopConfig
    from attnprobe.studies.loop.study import run_study

    qs = [{"id": f"q{i}", "question": f"What is item {i}?", "answers": [str(i)], "type": None} for i in range(3)]

    def answers(messages, tools):
        return "<answer>1</answer>"

    def searches(messages, tools):
        return ("<search>holmium</search>" if messages[-1]["content"].startswith("Answer the given question")
                else "<answer>1</answer>")

    quiet = ("setting ircot:o retrieved nothing: no observation held a passage (none in any of its 3 recorded "
             f"calls; 0 retrievals over 3 questions){FROM_EDITS}")  # study.json decides from the calls since issue 29
    never = ("the baseline none never searched (0 retrievals over 3 questions): its agent answered without "
             "retrieving, so no setting's difference from it is a policy's effect on retrieved text")
    for name, script, first in (("quiet", answers, [never, quiet]),
                                ("busy", searches, [])):
        out = tmp_path / name
        _, study = run_study(LocalExecutor(lambda s=script: ScriptedChat(s), progress=False), out, qs,
                             ["none", "ircot:o"], LoopConfig("ircot", ircot_form="chat", max_turns=2), n_boot=50)
        n = "n = 3: intervals are not informative (95% bootstrap CIs over fewer than 10 questions)"
        assert study["caveats"] == first + [n]
        md = (out / "study.md").read_text()
        assert f"- {n}" in md and all(f"- {c}" in md for c in first) and (first or "retrieved nothing" not in md)
        assert json.loads((out / "study.json").read_text())["caveats"] == study["caveats"]


# ------------------------------------------------------------------ n
@pytest.mark.parametrize("ns, want", [([3, 3], "n = 3"), ([2, 3, 40], "n = 2 to 3"), ([10, 25], None),
                                      ([0, 0], None), ([1], "n = 1")])
def test_few_questions_threshold(ns, want):
    got = CV.few_questions(ns)
    assert got == ([] if want is None else [f"{want}: intervals are not informative (95% bootstrap CIs over fewer "
                                            "than 10 questions)"])


# ------------------------------------------------------------------ injected system text
TOKENS = ["<|im_start|>", "system\n", "You are", " SmolLM", "<|im_end|>", "\n",  # template: injected system
          "<|im_start|>", "user\n", "Who", " won?", "<|im_end|>", "\n", "<|im_start|>", "assistant\n",
          "I", " think"]


def _capture(with_system: bool) -> CaptureResult:
    """A call of 16 tokens: either the template's injected system line (tokens 0-5: 5 up to and including
    <|im_end|>, then the newline) before the user turn, or the same tokens sent as a system message."""
    text = "".join(TOKENS)
    ends = np.cumsum([len(t) for t in TOKENS])
    offsets = np.stack([ends - [len(t) for t in TOKENS], ends], axis=1)
    if with_system:
        segs = [("template", "external", 0, 0, 0, 2), ("system", "external", 0, 0, 2, 4),
                ("template", "external", 0, 1, 4, 8)]
    else:
        segs = [("template", "external", 0, 1, 0, 8)]
    segs += [("task", "external", 0, 1, 8, 10), ("template", "external", 0, 2, 10, 14),
             ("reasoning", "self", 0, 2, 14, 16)]
    segments = [Segment(role=r, author=a, turn=t, message_index=m, start=s, end=e) for r, a, t, m, s, e in segs]
    queries = [QueryPoint(position=13, kind="decision", turn=0, message_index=2)]
    tok = np.full((1, 16), 0.0, dtype=np.float32)
    tok[0, :14] = 1 / 14
    seg_att = np.stack([tok[:, s.start:s.end].sum(1) for s in segments], axis=1)
    return CaptureResult(trajectory_id="c", input_ids=np.arange(16), segments=segments, queries=queries, layers=[0],
                         segment_attention=seg_att, layer_head_attention=seg_att[:, None, None, :].copy(),
                         token_attention=tok, meta={"trajectory_meta": {"question_id": "q1", "step": 1}}, text=text,
                         offsets=offsets)


def test_injected_system_tokens_known_count():
    # no system message: the leading template run up to <|im_end|> and its newline is system (6 tokens)
    assert injected_system_tokens(_capture(False)) == 6
    assert call_record(_capture(False))["queries"]["decision"]["shares"]["system"] == pytest.approx(6 / 14)
    assert injected_system_tokens(_capture(True)) == 0  # a system message was sent: nothing injected
    doc = {"settings": {"a": setting_attention([_capture(False), _capture(False)], n_boot=10, min_past=0),
                        "b": setting_attention([_capture(True)], n_boot=10, min_past=0)}}
    assert doc["settings"]["a"]["injected_system"] == {"calls": 2, "min_tokens": 6, "max_tokens": 6}
    assert CV.injected_system(doc) == [
        "system includes the chat template's injected text (6 tokens): 2 captured calls sent no system message, so "
        "their system share is the template's default system text and the first token (the attention sink)"]
    assert CV.injected_system({"settings": {"b": doc["settings"]["b"]}}) == []


# ------------------------------------------------------------------ past-turn filter
def test_past_turn_filter_counts_first_calls_and_too_few_past():
    doc = {"min_past": 5, "settings": {
        "none": {"captured_calls": 7, "decision": {"left_out": {"first_call": 2, "too_few_past": 3, "not_captured": 1}}},
        "mask:5": {"captured_calls": 4, "decision": {"left_out": {"first_call": 1, "too_few_past": 0}}}}}
    assert CV.past_turn_filter(doc) == ["6 steps excluded by the past-turn filter (fewer than 5 past turns, "
                                        "--shares-min-past; seed 002 E.5): none 5 of 7, mask:5 1 of 4"]
    doc["settings"] = {"none": {"captured_calls": 3, "decision": {"left_out": {"first_call": 0, "too_few_past": 0,
                                                                               "not_captured": 2}}}}
    assert CV.past_turn_filter(doc) == []


# ------------------------------------------------------------------ the runner
def test_runner_caveat_only_under_a_policy_that_saw_no_search():
    runs = [{"workers": [{"searches": 0}, {"searches": 0}]}, {"workers": []}]
    assert CV.runner_caveats(runs, "mask:1") == [
        "setting mask:1 retrieved nothing: no policy acted (no search worker ran a search in 2 runs); the policy "
        "changed nothing the agents saw"]
    assert CV.runner_caveats(runs, "none") == []
    assert CV.runner_caveats([{"workers": [{"searches": 2}]}, *runs], "mask:1") == []


# ------------------------------------------------------------------ the capture model of `study attention`
def _served_study(tmp_path):
    out = make_study(tmp_path / "study")
    study = json.loads((out / "study.json").read_text())
    study["models"] = ["scripted"]
    (out / "study.json").write_text(json.dumps(study))
    (out / SETTINGS_FILE).write_text(json.dumps({"study interference": {"model": "openai:scripted"}}))
    (out / "study.md").write_text("# Interference study: scaffold seed002, model scripted\n")
    return out


def test_served_study_without_model_is_refused_in_one_line(tmp_path, capsys):
    from attnprobe.cli.main import main

    out = _served_study(tmp_path)
    assert main(["study", "attention", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "was made against the served model 'scripted', whose weights are not on this machine" in err
    assert "--model PATH" in err and len(err) < 300
    assert not (out / "attention.md").exists()


def test_local_study_captures_with_its_own_weights(tmp_path):
    from attnprobe.studies.loop.capture_model import choose_capture_model

    out = make_study(tmp_path / "study")
    weights = tmp_path / "agent-7b"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    (out / SETTINGS_FILE).write_text(json.dumps({"study interference": {"model": f"transformers:{weights}:bfloat16"}}))
    c = choose_capture_model(out, None)
    assert (c.spec, c.dtype, c.capture_model, c.differs) == (str(weights), "bfloat16", "agent-7b", True)
    # study.json names toy-model; a study whose results name the weights' folder is the same model
    study = json.loads((out / "study.json").read_text())
    study["models"] = ["agent-7b"]
    (out / "study.json").write_text(json.dumps(study))
    assert not choose_capture_model(out, None).differs
    # a served model served by its local path is captured with it, as the agent's own
    (out / SETTINGS_FILE).write_text(json.dumps({"study interference": {"model": f"openai:{weights}"}}))
    c = choose_capture_model(out, None)
    assert (c.spec, c.agent_model, c.differs) == (str(weights), "agent-7b", False)


def test_another_model_is_named_with_the_agents_in_every_output(tmp_path, monkeypatch, capsys):
    from attnprobe.cli import options
    from attnprobe.cli.main import main

    out = _served_study(tmp_path)
    other = tmp_path / "other-model"
    other.mkdir()
    (other / "config.json").write_text("{}")

    class NoModel:  # the hand-built study has no current result: nothing is captured, no model loads
        def run(self, job):
            raise AssertionError("nothing to capture")

    monkeypatch.setattr(options, "executor", lambda args, **kw: contextlib.nullcontext(NoModel()))
    assert main(["study", "attention", str(out), "--model", str(other), "--no-progress"]) == 0
    label = "capture model other-model, agent model scripted"
    assert capsys.readouterr().err.count(  # warned once on the console
        f"study attention: {label}: the attention is another model's reading of the agent's contexts, and every "
        "output says so") == 1
    doc = json.loads((out / "attention.json").read_text())
    assert (doc["capture"]["capture_model"], doc["capture"]["agent_model"]) == ("other-model", "scripted")
    assert doc["caveats"][0].startswith(f"{label}: ")
    md = (out / "attention.md").read_text()
    study_md = (out / "study.md").read_text()
    for text in (md, study_md):
        assert f"- {doc['caveats'][0]}" in text  # the caveat block
        # the header, both query headings, 5 table captions per query (the per-token paired one since issue 37)
        # and the counterfactual heading
        assert text.count(label) >= 1 + 2 + 10 + 1, text
        assert text.count(f"({label})") == 2 + 10 + 1


def test_injected_system_tokens_of_smollm2s_template(bundled_folder):
    """On the bundled model's own chat template (its tokenizer only, no weights): a call sent without a system
    message gets "<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging
    Face<|im_end|>\\n", 21 tokens counted as system; with a system message nothing is injected."""
    from transformers import AutoTokenizer

    from attnprobe.render.rendering import render
    from attnprobe.trajectory.schema import Trajectory

    tok = AutoTokenizer.from_pretrained(str(bundled_folder), local_files_only=True)

    def k(messages):
        r = render(Trajectory.from_dict({"id": "x", "task": "Who?", "messages": messages}), tok)
        n = len(r.input_ids)
        res = CaptureResult(trajectory_id="x", input_ids=np.asarray(r.input_ids), segments=r.segments, queries=[],
                            layers=[0], segment_attention=np.zeros((0, len(r.segments))),
                            layer_head_attention=np.zeros((0, 1, 1, len(r.segments))), token_attention=np.zeros((0, n)),
                            meta={}, text=r.text, offsets=np.asarray(r.offsets))
        return injected_system_tokens(res)

    chat = [{"role": "user", "content": "Who won the cup?"}, {"role": "assistant", "content": "I think Brazil."}]
    assert k(chat) == 21
    assert k([{"role": "system", "content": "Answer briefly."}, *chat]) == 0


def test_malformed_study_json_gives_no_caveat_and_no_crash():
    assert CV.study_caveats({"settings": {"a": 3, "b": {"questions": 12, "art": 0.0}}, "config": [1],
                             "baseline": "x"}) == ["setting b retrieved nothing: no policy acted (0 retrievals over 12 questions); "
                                                 + GREEDY]
    assert CV.study_caveats({"settings": [1, 2]}) == []
