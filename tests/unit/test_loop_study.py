"""The interference study around the scaffolds: question sets, scoring, metrics, the job (resume), the CLI's
early errors and the tag-format importer. No model is loaded (a scripted chat model answers)."""

from __future__ import annotations

import json
import math

import pytest
from support.interference import run_interference as run_study
from support.scripted_chat import ScriptedChat

from attnprobe.agents.answers import exact_match
from attnprobe.agents.answers import normalize_answer as em_normalize
from attnprobe.agents.questions import QuestionsError, read_questions
from attnprobe.execution.local import LocalExecutor
from attnprobe.studies.loop.agents import LoopConfig
from attnprobe.studies.loop.job import InterferenceJob
from attnprobe.studies.loop.metrics import bootstrap_ci, mcnemar_exact, paired, summarize, summarize_setting
from attnprobe.studies.loop.scoring import extract_answer, extract_confidence
from attnprobe.trajectory.importers import iter_import


def _write(path, lines):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return path


# ------------------------------------------------------------------ question sets
def test_reads_the_formats_users_have(tmp_path):
    p = _write(tmp_path / "q.jsonl", [
        {"id": "f1", "question": "Q1?", "golden_answers": ["a", "b"], "metadata": {"type": "multi-hop"}},  # FlashRAG
        {"_id": "5a8b", "question": "Q2?", "answer": "yes", "type": "comparison"},  # HotpotQA / 2Wiki
        {"id": "2hop_1", "question": "Q3?", "answer": "Paris", "answer_aliases": ["City of Light"]},  # MuSiQue
        {"Question": "Q4?", "Answer": "1970"},  # Bamboogle
        {"question": "Q5?", "answer": {"value": "Ho", "aliases": ["holmium"]}},  # TriviaQA
        {"question": "Q6?", "possible_answers": "[\"x\", \"y\"]"},  # PopQA
        {"query_id": 769, "query": "Q7?", "answer": "42"},  # BrowseComp-Plus
        {"question": "Q8?", "answers": [1991, "1,991"]},  # NQ-open style
    ])
    qs = read_questions(p)
    assert [(q["id"], q["question"], q["answers"], q["type"]) for q in qs] == [
        ("f1", "Q1?", ["a", "b"], "multi-hop"), ("5a8b", "Q2?", ["yes"], "comparison"),
        ("2hop_1", "Q3?", ["Paris", "City of Light"], None), ("q004", "Q4?", ["1970"], None),
        ("q005", "Q5?", ["Ho", "holmium"], None), ("q006", "Q6?", ["x", "y"], None),
        ("769", "Q7?", ["42"], None), ("q008", "Q8?", ["1991", "1,991"], None)]


@pytest.mark.parametrize("line, message", [
    ({"id": "a"}, "line 2: field 'question': missing"),
    ({"question": ""}, "line 2: field 'question': must be a non-empty string"),
    ({"question": "Q", "golden_answers": []}, "line 2: field 'golden_answers': expected a string or number or a "
                                              "non-empty list of them, got an empty list"),
    ({"question": "Q", "answer": {"x": 1}}, "line 2: field 'answer': an answer object needs 'value' or 'aliases'"),
    ({"id": "a b", "question": "Q"}, "line 2: field 'id': use 1-128 letters"),
    ({"id": "ok", "question": "Q"}, "line 2: field 'id': duplicate id 'ok'"),
    ("[1]", "line 2: expected a JSON object"),
])
def test_question_errors_name_file_line_and_field(tmp_path, line, message):
    p = _write(tmp_path / "bad.jsonl", [{"id": "ok", "question": "fine"}, line])
    with pytest.raises(QuestionsError) as exc:
        read_questions(p)
    assert str(exc.value).startswith(f"{p}, {message}")


def test_shipped_question_set_reads():
    from attnprobe.resources import data_path

    qs = read_questions(data_path("questions_loop.jsonl"))
    assert len(qs) == 8 and {q["type"] for q in qs} == {"single-hop", "multi-hop"}


# ------------------------------------------------------------------ scoring
def test_em_is_search_r1_normalised_exact_match():
    assert em_normalize("The  Great Eastern!") == "great eastern"
    assert exact_match("the Great-Eastern", ["Great Eastern"]) is False  # punctuation dropped, not spaced
    assert exact_match("An Ariane 5.", ["Ariane 5"]) is True
    assert exact_match("Ariane 5 rocket", ["Ariane 5"]) is False  # exact, not containment
    assert exact_match("Zürich", ["Zurich"]) is False  # no accent folding (seed 004's EM)
    assert exact_match(None, ["x"]) is False and exact_match("x", []) is None


def test_seed002_answer_and_confidence_extraction():
    resp = "Explanation: because [3].\nExact Answer: 1970\nConfidence: 85%"
    assert extract_answer(resp) == "1970" and extract_confidence(resp) == 85
    assert extract_answer("just 1970") == "just 1970" and extract_confidence("no score") == 100


# ------------------------------------------------------------------ metrics
def R(qid, correct, retrievals=1, tokens=(10,), seconds=1.0, calls=None):
    n = len(tokens)
    return {"question_id": qid, "question": qid, "correct": correct, "no_answer": False, "retrievals": retrievals,
            "tool_calls": calls if calls is not None else retrievals, "model_calls": n,
            "input_tokens": sum(tokens), "output_tokens": 2 * n, "context_tokens": sum(tokens) / n,
            "context_chars": 0.0, "seconds": seconds}


def test_setting_numbers_as_quoted():
    rs = [R("a", True, 2, (100, 200)), R("b", False, 1, (50,)), R("c", True, 3, (10, 20, 30)), R("d", None, 0)]
    s = summarize_setting(rs, n_boot=500)
    assert s["scored"] == 3 and s["correct"] == 2 and s["accuracy"] == pytest.approx(2 / 3)
    assert s["art"] == pytest.approx((2 + 1 + 3 + 0) / 4)
    assert s["context_tokens"] == pytest.approx((150 + 50 + 20 + 10) / 4)  # mean over calls, then over questions
    assert s["input_tokens"] == pytest.approx((300 + 50 + 60 + 10) / 4)  # rolling: summed over calls
    lo, hi = s["accuracy_ci"]
    assert 0 <= lo <= 2 / 3 <= hi <= 1


def test_bootstrap_and_mcnemar_known_values():
    assert bootstrap_ci([1.0]) is None
    assert bootstrap_ci([2.0, 2.0, 2.0]) == (2.0, 2.0)
    assert mcnemar_exact(5, 0) == pytest.approx(2 / 32)  # two-sided: 2 * 0.5**5
    assert mcnemar_exact(3, 1) == pytest.approx(0.625)  # 2 * P(X <= 1), X ~ Bin(4, 1/2) = 2 * 5/16
    assert mcnemar_exact(0, 0) == 1.0


def test_paired_fixed_and_broken():
    base = {q: R(q, c) for q, c in zip("abcd", (True, False, False, True))}
    other = {q: R(q, c) for q, c in zip("abcd", (True, True, True, False))}
    p = paired(base, other, n_boot=200)
    assert p["fixed"] == ["b", "c"] and p["broken"] == ["d"] and p["accuracy_diff"] == pytest.approx(0.25)
    full = summarize({"none": list(base.values()), "x": list(other.values())}, "none", n_boot=200)
    assert full["questions"]["b"]["fixed_by"] == ["x"] and full["questions"]["d"]["broken_by"] == ["x"]
    assert full["questions"]["a"]["correct"] == {"none": True, "x": True}


# ------------------------------------------------------------------ the job: resume gives the same records
QUESTIONS = [{"id": f"q{i}", "question": f"What is item {i}?", "answers": [str(i)], "type": None} for i in range(3)]


def script(messages, tools):
    last = messages[-1]["content"]
    if last.startswith("Answer the given question"):
        return "<think>look it up</think><search>holmium</search>"
    n = last.split("item ")[1][0] if "item " in last else "0"
    # a deterministic answer from what was sent: q1 is answered wrongly when earlier documents are dropped
    return f"<answer>{n}</answer>"


def _run(out, chat, settings=("none", "ircot:o")):
    cfg = LoopConfig("ircot", ircot_form="chat", max_turns=3)
    return run_study(LocalExecutor(lambda: chat, progress=False), out, QUESTIONS, list(settings), cfg, n_boot=100)


def _files(root):
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name not in ("study.json", "study.md", "errors.jsonl"):
            text = p.read_text(encoding="utf-8")
            if p.suffix == ".json":
                rec = json.loads(text)
                rec.pop("seconds", None)
                text = json.dumps(rec, sort_keys=True)
            out[str(p.relative_to(root))] = text
    return out


def test_resumed_study_gives_the_same_records(tmp_path):
    counts, study = _run(tmp_path / "whole", ScriptedChat(script))
    assert counts == {"done_before": 0, "done": 6, "failed": 0}
    # interrupted at the 4th model call (the second question), then resumed
    counts1, _ = _run(tmp_path / "resumed", ScriptedChat(script, fail_on_call=4))
    assert counts1["failed"] == 1 and counts1["done"] == 5
    counts2, study2 = _run(tmp_path / "resumed", ScriptedChat(script))
    assert counts2 == {"done_before": 5, "done": 1, "failed": 0}
    assert _files(tmp_path / "whole") == _files(tmp_path / "resumed")
    assert study2["settings"]["none"]["accuracy"] == study["settings"]["none"]["accuracy"]
    # nothing left: a third run runs nothing
    assert _run(tmp_path / "resumed", ScriptedChat(script))[0]["done"] == 0
    # a changed loop option is not "done"
    job = InterferenceJob(tmp_path / "whole", QUESTIONS, ["none"], LoopConfig("ircot", ircot_form="chat", max_turns=2))
    assert not any(job.done(it) for it in job.items())
    md = (tmp_path / "whole" / "study.md").read_text()
    assert "| none | 3 |" in md and "## Against none" in md
    # one calls file per setting, in question order, each line a trajectory capture can read
    import attnprobe

    trajs = attnprobe.load_trajectories(tmp_path / "whole" / "ircot-o" / "calls.jsonl")
    assert [t.id for t in trajs][:2] == ["ircot-o/q0/step-1", "ircot-o/q0/step-2"]


def test_study_numbers_match_the_records(tmp_path):
    counts, study = _run(tmp_path, ScriptedChat(script), settings=("none",))
    rs = [json.loads((tmp_path / "none" / "results" / f"q{i}.json").read_text()) for i in range(3)]
    s = study["settings"]["none"]
    assert s["art"] == pytest.approx(sum(r["retrievals"] for r in rs) / 3)
    assert s["context_tokens"] == pytest.approx(sum(r["context_tokens"] for r in rs) / 3)
    assert s["accuracy"] == pytest.approx(sum(bool(r["correct"]) for r in rs) / 3)
    assert all(math.isfinite(v) for v in (s["art"], s["context_tokens"]))


# ------------------------------------------------------------------ CLI: bad input fails before any model loads
@pytest.mark.parametrize("extra, needle", [
    (["--policy", "mask:x"], "K must be an integer"),
    (["--judge", "gpt"], "--judge 'gpt'"),
    (["--policy", "none", "--baseline", "mask:5"], "--baseline 'mask:5' is not one of the settings"),
])
def test_cli_refuses_bad_options(tmp_path, capsys, extra, needle):
    from attnprobe.cli.main import main
    from attnprobe.resources import data_path

    code = main(["study", "interference", "--ircot-form", "chat", str(data_path("questions_loop.jsonl")), "--out", str(tmp_path / "o"),
                 *extra])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err


def test_cli_bad_questions_file(tmp_path, capsys):
    from attnprobe.cli.main import main

    p = _write(tmp_path / "q.jsonl", [{"question": "ok?"}, {"question": "Q", "answer": []}])
    assert main(["study", "interference", str(p), "--out", str(tmp_path / "o")]) == 2
    assert f"{p}, line 2: field 'answer'" in capsys.readouterr().err


# ------------------------------------------------------------------ importer for tag-format logs
def test_tag_log_import(tmp_path):
    """The agent's text stays as it was (one assistant message for a Search-R1 rollout); the spans are
    annotations at exact character offsets, tags included."""
    text = ("<think>who?</think>\n<search> Astrid Cleve </search>\n\n<information>Doc 1(Title: A) x</information>\n"
            "<think>son</think><search>Ulf von Euler</search><information>Doc 1(Title: U) 1970</information>"
            "<think>done</think><answer> 1970 </answer>")
    p = _write(tmp_path / "log.jsonl", [{"id": "r1", "prompt": "Question: who?", "response": text, "answer": "1970",
                                         "golden_answers": ["1970"], "data_source": "nq"},
                                        {"messages": [{"role": "user", "content": "Q"},
                                                      {"role": "assistant", "content": text}]}])
    t1, t2 = list(iter_import(p, "tags"))
    assert t1.id == "r1" and t1.task == "Question: who?" and t1.labels == {"answer": "1970", "golden_answers": ["1970"]}
    assert t1.meta["data_source"] == "nq"
    assert t1.messages[0] == {"role": "user", "content": "Question: who?"}
    assert t1.messages[1]["role"] == "assistant" and t1.messages[1]["content"] == text and len(t1.messages) == 2
    spans = [(text[a["start"]:a["end"]], a["role"], a["author"]) for a in t1.messages[1]["annotations"]]
    assert spans == [("<search> Astrid Cleve </search>", "tool_call", "self"),
                     ("<information>Doc 1(Title: A) x</information>", "observation", "external"),
                     ("<search>Ulf von Euler</search>", "tool_call", "self"),
                     ("<information>Doc 1(Title: U) 1970</information>", "observation", "external")]
    assert t1.messages[1]["annotations"][0] == {"start": 20, "end": 51, "role": "tool_call", "author": "self"}
    assert t2.id == "log-2" and t2.messages[1] == t1.messages[1]
    bad = _write(tmp_path / "bad.jsonl", [{"id": "x", "prompt": "Q"}])
    with pytest.raises(Exception) as exc:
        list(iter_import(bad, "tags"))
    assert "line 1" in str(exc.value) and "response" in str(exc.value)


def test_judge_sends_the_f5_prompt_and_reads_its_verdict():
    from attnprobe.studies.loop.prompts import JUDGE_PROMPT
    from attnprobe.studies.loop.scoring import Scorer

    judge = Scorer("openai:http://127.0.0.1:9/v1:grader")
    judge._chat = ScriptedChat(lambda m, t: "extracted_final_answer: 1970\nreasoning: same year\n**correct: yes**\n"
                                            "confidence: 85%")
    v = judge("Q?", "Exact Answer: 1970", "1970", ["1970", "nineteen seventy"])
    assert judge._chat.sent == [[{"role": "user", "content": JUDGE_PROMPT.format(
        question="Q?", response="Exact Answer: 1970", correct_answer="1970")}]]
    assert (v.correct, v.scorer, v.extracted, v.confidence) == (True, "judge:grader", "1970", 85)
    judge._chat = ScriptedChat(lambda m, t: "correct: no")
    v = judge("Q?", "x", "x", ["1970"])
    assert v.correct is False and v.confidence == 100  # F.5: 100 when no confidence is given


def test_by_type_columns():
    rs = [dict(R("a", True, 2), type="single-hop"), dict(R("b", False, 4), type="multi-hop"),
          dict(R("c", True, 2), type="multi-hop")]
    full = summarize({"none": rs}, "none", n_boot=50)
    assert full["by_type"]["none"] == {"single-hop": {"questions": 1, "accuracy": 1.0, "art": 2.0},
                                       "multi-hop": {"questions": 2, "accuracy": 0.5, "art": 3.0}}
    from attnprobe.studies.loop.metrics import markdown

    md = markdown(full, scaffold="ircot", scorer="em")
    assert "| none | 50.0 / 3.00 | 100.0 / 2.00 |" in md


def test_tag_log_import_cli(tmp_path, capsys):
    import attnprobe
    from attnprobe.cli.main import main

    src = _write(tmp_path / "sr1.jsonl", [{"id": "a", "prompt": "Q?", "response": "<search>x</search>"
                                           "<information>Doc 1(Title: X) y</information><answer>y</answer>"}])
    out = tmp_path / "out.jsonl"
    assert main(["import", str(src), "--format", "tags", "--out", str(out)]) == 0
    (t,) = attnprobe.load_trajectories(out)
    assert [m["role"] for m in t.messages] == ["user", "assistant"]  # one rollout, one message, as the agent saw it
    assert [a["role"] for a in t.messages[1]["annotations"]] == ["tool_call", "observation"]
    assert main(["import", str(_write(tmp_path / "bad.jsonl", ["[]"])), "--format", "tags", "--out",
                 str(tmp_path / "o2.jsonl")]) == 2
    assert "line 1" in capsys.readouterr().err


LOCK_HOLDER = """
import sys, time
from pathlib import Path
from attnprobe.io import hold_dir_lock
with hold_dir_lock(Path(sys.argv[1]), "study folder"):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_study_folder_in_use_is_refused_by_both_study_commands(tmp_path, capsys):
    """One run per study folder: `study interference` and `study attention` refuse a folder another process
    holds, in one line naming it, before any model loads (both rewrite study.md)."""
    import subprocess
    import sys

    from support.studydir import make_study

    from attnprobe.cli.main import main
    from attnprobe.resources import data_path

    out = make_study(tmp_path / "study")
    proc = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        assert main(["study", "attention", str(out)]) == 2
        assert main(["study", "interference", str(data_path("questions_loop.jsonl")), "--scaffold", "seed002",
                     "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count(f"the study folder is in use by process {proc.pid}") == 2, err
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------ seed002 defaults and what study.json records
def test_loop_config_defaults_per_scaffold_and_the_cpu_preset():
    seed = LoopConfig("seed002")  # seed 002 appendix C: 8192 output tokens per turn, temperature 1.0
    assert (seed.max_new_tokens, seed.temperature, seed.max_turns, seed.top_k, seed.open_lines) == (8192, 1.0, 10, 15, 50)
    assert (LoopConfig("ircot", ircot_form="chat").max_new_tokens, LoopConfig("ircot", ircot_form="chat").temperature) == (128, 0.0)  # unchanged
    cpu = LoopConfig("seed002", preset="cpu")
    assert (cpu.max_new_tokens, cpu.temperature) == (128, 0.0)
    assert (LoopConfig("seed002", preset="cpu", max_new_tokens=64, temperature=0.5).max_new_tokens,
            LoopConfig("seed002", preset="cpu", temperature=0.5).temperature) == (64, 0.5)  # explicit values win
    assert seed.to_dict() != cpu.to_dict()  # a run with other defaults is not "done"
    with pytest.raises(ValueError, match="preset must be one of cpu"):
        LoopConfig("seed002", preset="gpu")


def test_seed002_study_json_records_the_rule_placeholder_prompts_and_generation(tmp_path):
    from attnprobe.studies.loop.job import InterferenceJob
    from attnprobe.studies.loop.prompts import prompts_hash

    def answer(messages, tools):
        return "Explanation: known.\nExact Answer: 4\nConfidence: 90%"

    cfg = LoopConfig("seed002", max_turns=2)
    counts, study = run_study(LocalExecutor(lambda: ScriptedChat(answer), progress=False), tmp_path,
                              QUESTIONS[:1], ["none", "mask:1", "mask-obs:2"], cfg, n_boot=10)
    doc = json.loads((tmp_path / "study.json").read_text())
    assert doc["config"] == {"scaffold": "seed002", "max_turns": 2, "top_k": 15, "open_lines": 50, "max_tokens": 8192,
                             "temperature": 1.0, "judge": "exact", "search": "bm25", "corpus": None, "preset": None,
                             "prompts": prompts_hash("seed002")}
    assert set(doc["policy_rules"]) == {"mask:1", "mask-obs:2"}  # none has no rule
    assert doc["policy_rules"]["mask:1"]["placeholder"] == (
        "[Auto-archived browser result] tool=<name> | args: <k=repr(v)[:80], ...>")
    assert "i-DeepSearch/observation-masking tools/context_management.py" in doc["policy_rules"]["mask:1"]["rule"]
    assert doc["policy_rules"]["mask-obs:2"]["placeholder"].startswith("[Observation omitted to save context.")
    # a result made under the old observation-count mask:K (no policy_rules) is not "done"
    path = tmp_path / "mask-1" / "results" / f"{QUESTIONS[0]['id']}.json"
    rec = json.loads(path.read_text())
    job = InterferenceJob(tmp_path, QUESTIONS[:1], ["mask:1"], cfg)
    assert all(job.done(it) for it in job.items())
    path.write_text(json.dumps({k: v for k, v in rec.items() if k != "policy_rules"}))
    assert not any(job.done(it) for it in job.items())


def test_cli_preset_cpu_reaches_the_config():
    from attnprobe.cli.loop import interference_options
    from attnprobe.cli.main import build_parser
    from attnprobe.resources import data_path

    q = str(data_path("questions_loop.jsonl"))

    def config(*extra):
        return interference_options(build_parser().parse_args(["study", "interference", q, "--scaffold", "seed002",
                                                               "--out", "o", *extra])).config

    seen = [config(), config("--generation-preset", "cpu", "--max-new-tokens", "64")]
    assert [(c.max_new_tokens, c.temperature, c.preset) for c in seen] == [(8192, 1.0, None), (64, 0.0, "cpu")]
