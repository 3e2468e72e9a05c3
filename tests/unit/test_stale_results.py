"""Issue 27, stale results and silent replacement: "done" means the same inputs (every result is stamped with
what made it), a rerun with other options is refused in one line unless --force (one settings record per
output folder, shared by the commands), a summary is never rewritten from fewer results than are on disk,
and ``study attention`` uses only the calls of current results. Scripted chats, no model."""

from __future__ import annotations

import json

import pytest
from support.interference import run_interference as run_study
from support.scripted_chat import ScriptedChat

from attnprobe.errors import AttnprobeError
from attnprobe.execution.local import LocalExecutor
from attnprobe.io.settings import SETTINGS_FILE, check_settings
from attnprobe.studies.loop.agents import LoopConfig
from attnprobe.studies.loop.attention import current_results, histories, read_study, recorded_calls
from attnprobe.studies.loop.attention_report import ATTENTION_JSON, ATTENTION_MD, HEADING, results_stamp
from attnprobe.studies.loop.job import InterferenceJob

QUESTIONS = [{"id": f"q{i}", "question": f"What is item {i}?", "answers": [str(i)], "type": None} for i in range(3)]


def script(messages, tools):
    """One search, then the item's number from the question as the answer."""
    if messages[-1]["content"].startswith("Answer the given question"):
        return "<think>look it up</think><search>holmium</search>"
    text = " ".join(m["content"] for m in messages if "item " in m["content"])
    return f"<answer>{text.split('item ')[1][0]}</answer>"


def failing(messages, tools):
    raise RuntimeError("endpoint down")


def _run(out, questions=QUESTIONS, chat=None, settings=("none",), force=False, **cfg):
    config = LoopConfig("ircot", ircot_form="chat", **{"max_turns": 3, **cfg})
    ex = LocalExecutor(lambda: chat or ScriptedChat(script), progress=False)
    return run_study(ex, out, list(questions), list(settings), config, n_boot=50, force=force)


def _result(out, qid, setting="none"):
    return json.loads((out / setting / "results" / f"{qid}.json").read_text())


# ------------------------------------------------------------------ 1. done = the same inputs
def test_a_changed_question_or_gold_answer_reruns_that_item_only(tmp_path):
    counts, study = _run(tmp_path)
    assert counts["done"] == 3 and study["settings"]["none"]["accuracy"] == 1.0
    changed = [QUESTIONS[0], {**QUESTIONS[1], "answers": ["7"]}, {**QUESTIONS[2], "question": "What is item 5?"}]
    job = InterferenceJob(tmp_path, changed, ["none"], LoopConfig("ircot", ircot_form="chat", max_turns=3))
    assert [job.done(it) for it in job.items()] == [True, False, False]
    counts, study = _run(tmp_path, changed)
    assert counts == {"done_before": 1, "done": 2, "failed": 0}
    q1, q2 = _result(tmp_path, "q1"), _result(tmp_path, "q2")
    assert (q1["answer"], q1["correct"]) == ("1", False)  # the answer scored against the new gold
    assert (q2["answer"], q2["correct"]) == ("5", False)  # the new text was asked
    assert study["settings"]["none"]["accuracy"] == pytest.approx(1 / 3)


# ------------------------------------------------------------------ 2. other options: refused unless --force
def test_a_rerun_with_another_option_is_refused_in_one_line_unless_force(tmp_path):
    _run(tmp_path)
    before = {p: (tmp_path / p).read_text() for p in ("study.md", "study.json")}
    with pytest.raises(AttnprobeError) as err:
        _run(tmp_path, max_turns=2, chat=ScriptedChat(failing))
    msg = str(err.value)
    assert msg == (f"{tmp_path}: study interference ran there with other options: --max-turns was 3, now 2; use "
                   "--force to redo or another --out")
    assert "\n" not in msg and len(msg) < 300
    # 4. nothing was rewritten: the summary still holds the 3 results on disk (it was n = 0 before the fix)
    assert {p: (tmp_path / p).read_text() for p in before} == before
    counts, study = _run(tmp_path, max_turns=2, force=True)
    assert counts["done"] == 3 and study["config"]["max_turns"] == 2
    assert json.loads((tmp_path / SETTINGS_FILE).read_text())["study interference"]["max_turns"] == 2
    # adding a setting is not another option: it runs beside the others
    counts, _ = _run(tmp_path, max_turns=2, settings=("none", "ircot:o"))
    assert counts == {"done_before": 3, "done": 3, "failed": 0}


def _check_and_record(out, command, wanted, **kw):
    from attnprobe.io.settings import record_settings

    check_settings(out, command, wanted, **kw)
    record_settings(out, command, wanted, force=kw.get("force", False))


def test_settings_record_names_the_option_and_keeps_older_keys(tmp_path):
    _check_and_record(tmp_path, "cmd", {"a": 1, "layers": [0, 1]})
    _check_and_record(tmp_path, "cmd", {"a": 1, "layers": [0, 1], "new": "x"})  # a key the record lacks: no conflict
    _check_and_record(tmp_path, "other", {"a": 2})  # another command's entry in the same folder
    with pytest.raises(AttnprobeError, match=r"cmd ran there with other options: --alpha was 1, now 3 \(and 1 "
                                             r"more\); use --force to redo or another --out$"):
        check_settings(tmp_path, "cmd", {"a": 3, "layers": [2]}, names={"a": "--alpha"})
    _check_and_record(tmp_path, "cmd", {"a": 3, "layers": [2]}, force=True)
    assert json.loads((tmp_path / SETTINGS_FILE).read_text()) == {"cmd": {"a": 3, "layers": [2]},
                                                                  "other": {"a": 2}}


# ------------------------------------------------------------------ 3. counterfactual without --actions
class _Executor:
    """Enough of an executor for the stage's bookkeeping: no model, nothing to run (``done`` steps said done)."""

    def __init__(self, done: int = 1):
        self.done = done

    def call(self, fn, names, opts):
        return {n: {} for n in names}

    def run(self, job):
        return {"done_before": 0, "done": self.done, "failed": 1 - self.done}


def test_a_counterfactual_rerun_without_actions_is_refused_unless_force(tmp_path):
    from support.cfrun import run_on

    from attnprobe.counterfactual.run import RunOptions
    from attnprobe.resources import data_path

    model = {"spec": "toy", "backend": "transformers", "dtype": "float32"}
    files = [data_path("long_research.jsonl")]  # steps with >= 6 past turns: the stage has a job to run

    def run(done=1, **kw):
        opts = RunOptions(actions=kw.pop("actions"), progress=False)
        return run_on(_Executor(done), tmp_path, files=files, opts=opts, **{"model": model, **kw})

    run(done=0, actions=False)
    assert not (tmp_path / SETTINGS_FILE).exists()  # nothing finished: nothing recorded (issue 38)
    run(actions=True)
    with pytest.raises(AttnprobeError, match=r"counterfactual ran there with other options: --actions was True, "
                                             r"now False \(and 1 more\); use --force to redo or another --out"):
        run(actions=False)
    with pytest.raises(AttnprobeError, match="--model was 'toy', now 'other'"):
        run(actions=True, model={**model, "spec": "other"})
    run(actions=False, force=True)


# ------------------------------------------------------------------ 4. summaries from every result on disk
def test_a_rerun_that_finishes_nothing_keeps_the_summary_of_the_results_on_disk(tmp_path):
    _run(tmp_path)
    counts, study = _run(tmp_path, [*QUESTIONS, {"id": "q9", "question": "What is item 9?", "answers": ["9"]}],
                         chat=ScriptedChat(failing))
    assert counts == {"done_before": 3, "done": 0, "failed": 1}
    assert study["settings"]["none"]["questions"] == 3 and study["settings"]["none"]["accuracy"] == 1.0


# ------------------------------------------------------------------ 5. study attention: current calls only
def test_calls_and_histories_are_those_of_current_results(tmp_path):
    _run(tmp_path)
    assert [t.id for t in recorded_calls(tmp_path, "none")][::2] == ["none/q0/step-1", "none/q1/step-1",
                                                                      "none/q2/step-1"]
    # q2 leaves the study, q1's result file is deleted: neither is captured nor counterfactualised
    _run(tmp_path, QUESTIONS[:2])
    (tmp_path / "none" / "results" / "q1.json").unlink()
    assert list(current_results(tmp_path, "none")) == ["q0"]
    assert {t.meta["question_id"] for t in recorded_calls(tmp_path, "none")} == {"q0"}
    assert [t.meta["question_id"] for t in histories(tmp_path, "none")] == ["q0"]


def test_a_setting_that_finishes_nothing_keeps_no_old_calls(tmp_path):
    _run(tmp_path)
    assert (tmp_path / "none" / "calls.jsonl").read_text()
    changed = [{**q, "question": q["question"].replace("item", "thing")} for q in QUESTIONS]
    counts, _ = _run(tmp_path, changed, chat=ScriptedChat(failing))
    assert counts["done"] == 0
    assert (tmp_path / "none" / "calls.jsonl").read_text() == ""
    assert recorded_calls(tmp_path, "none") == [] and read_study(tmp_path)["results"]["none"] == {}


def test_study_md_drops_an_attention_section_computed_from_other_results(tmp_path):
    _run(tmp_path)
    stamps = {s: results_stamp(v) for s, v in read_study(tmp_path)["results"].items()}
    (tmp_path / ATTENTION_JSON).write_text(json.dumps({"results_stamps": stamps}))
    (tmp_path / ATTENTION_MD).write_text(f"{HEADING} (attnprobe study attention)\n\n| shares |\n")
    _run(tmp_path)  # the same results: the section is kept
    assert (tmp_path / "study.md").read_text().endswith("| shares |\n")
    _run(tmp_path, [{**QUESTIONS[0], "answers": ["x"]}, *QUESTIONS[1:]])  # q0 reran: other results
    md = (tmp_path / "study.md").read_text()
    assert "| shares |" not in md
    assert f"{HEADING}\n\nDropped: the results of none changed since it ran; run 'attnprobe study attention" in md


def test_cli_refuses_another_model_or_option_in_one_line_before_anything_runs(tmp_path, monkeypatch, capsys):
    """`study interference` with another --served-model or --max-new-tokens on a finished folder: exit 2, one
    line naming the option, no model call, study.md untouched; --force redoes it."""
    from attnprobe.cli import adapter
    from attnprobe.cli.main import main

    chats = []

    def make_generator(args, **kw):  # the chat the adapter's executor loads (on first need)
        chats.append(ScriptedChat(script))
        return chats[-1]

    monkeypatch.setattr(adapter, "make_generator", make_generator)
    qfile = tmp_path / "q.jsonl"
    qfile.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    out = tmp_path / "study"
    argv = ["study", "interference", "--ircot-form", "chat", str(qfile), "--policy", "none", "--out", str(out), "--max-turns", "3",
            "--generator", "openai", "--base-url", "http://127.0.0.1:9/v1", "--no-progress"]
    assert main([*argv, "--served-model", "m1"]) == 0
    md = (out / "study.md").read_text()
    capsys.readouterr()
    made = len(chats)
    assert main([*argv, "--served-model", "m2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"attnprobe: error: {out}: study interference ran there with other options: --model/--served-model "
                   "was 'openai:m1', now 'openai:m2'; use --force to redo or another --out")
    assert main([*argv, "--served-model", "m1", "--max-new-tokens", "64"]) == 2
    assert "--max-new-tokens was 128, now 64" in capsys.readouterr().err
    assert (out / "study.md").read_text() == md and len(chats) == made  # refused before any chat was made
    assert main([*argv, "--served-model", "m2", "--force"]) == 0
    assert len(chats[-1].sent) == 6  # every item redone (two calls each)


def test_study_attention_runs_on_current_calls_and_stamps_its_section(tmp_path):
    """run_attention end to end without a model (an executor that captures nothing): the capture jobs and the
    counterfactual get only the calls and histories of current results, attention.json records their stamp,
    and study.md keeps the section until the results change."""
    from types import SimpleNamespace

    from attnprobe.capture.job import CaptureJob
    from attnprobe.counterfactual.job import CounterfactualJob
    from attnprobe.counterfactual.run import RunOptions
    from attnprobe.studies.loop.attention_study import run_attention

    class NoCapture:
        jobs: list = []

        def call(self, fn, names, opts):  # the counterfactual stage's settings, made where the model is
            return {n: {} for n in names}

        def run(self, job):
            self.jobs.append(job)
            return {"done_before": 0, "done": 0, "failed": 0}

    _run(tmp_path, settings=("none", "ircot:o"))
    _run(tmp_path, QUESTIONS[:2], settings=("none", "ircot:o"))  # q2 leaves the study
    (tmp_path / "ircot-o" / "results" / "q1.json").unlink()  # and one result is deleted
    model = SimpleNamespace(spec="no-such-model", backend="transformers", dtype="float32")
    ex = NoCapture()
    _, doc = run_attention(ex, tmp_path, model=model, counterfactual=RunOptions(), min_past=0, n_boot=10)
    calls = {job.out.parent.name: sorted({t.meta["question_id"] for t in job.trajectories})
             for job in ex.jobs if isinstance(job, CaptureJob)}
    assert calls == {"none": ["q0", "q1"], "ircot-o": ["q0"]}
    cf = [job for job in ex.jobs if isinstance(job, CounterfactualJob)]  # the stage, run on the same executor
    assert [sorted({s.trajectory.meta["question_id"] for s in job.steps}) for job in cf] == [["q0", "q1"]]
    assert cf[0].out == tmp_path / "ircot-o" / "counterfactual"  # the baseline's histories of its current results
    assert doc["settings"]["none"]["recorded_calls"] == 4 and doc["settings"]["ircot:o"]["recorded_calls"] == 2
    stamps = json.loads((tmp_path / ATTENTION_JSON).read_text())["results_stamps"]
    assert stamps == {s: results_stamp(current_results(tmp_path, s)) for s in ("none", "ircot:o")}
    assert (tmp_path / "study.md").read_text().count(HEADING) == 1 and "Dropped" not in (tmp_path / "study.md").read_text()
    _run(tmp_path, QUESTIONS[:2], settings=("none", "ircot:o"))  # q1 of ircot:o runs again: other results
    md = (tmp_path / "study.md").read_text()
    assert "Dropped: the results of ircot:o changed since it ran" in md


def test_study_attention_counterfactual_summary_names_both_models(tmp_path):
    """Issue 29: the summary.md that study attention's counterfactual stage writes in OUT/<setting>/counterfactual
    names both models when the capture model is not the agent's ("capture model X, agent model Y"), and neither
    when it is the agent's own."""
    from types import SimpleNamespace

    from attnprobe.counterfactual.run import RunOptions
    from attnprobe.studies.loop.attention_study import run_attention
    from attnprobe.studies.loop.capture_model import CaptureChoice

    class NoCapture:
        def call(self, fn, names, opts):
            return {n: {} for n in names}

        def run(self, job):
            return {"done_before": 0, "done": 0, "failed": 0}

    _run(tmp_path, settings=("none", "ircot:o"))
    model = SimpleNamespace(spec="no-such-model", backend="transformers", dtype="float32")
    other = CaptureChoice("no-such-model", None, capture_model="tiny-smollm2", agent_model="scripted-chat")
    run_attention(NoCapture(), tmp_path, model=model, counterfactual=RunOptions(), min_past=0, n_boot=10, models=other)
    md = (tmp_path / "ircot-o" / "counterfactual" / "summary.md").read_text()
    assert md.startswith("Steps with >= 0 past turns.\n\nCapture model tiny-smollm2, agent model scripted-chat: the "
                         "attention is the capture model's reading of the agent's contexts, not the agent's own.\n")
    same = CaptureChoice("no-such-model", None, capture_model="scripted-chat", agent_model="scripted-chat")
    run_attention(NoCapture(), tmp_path, model=model, counterfactual=RunOptions(), min_past=0, n_boot=10, models=same)
    md = (tmp_path / "ircot-o" / "counterfactual" / "summary.md").read_text()
    assert md.startswith("Steps with >= 0 past turns.\n\n## query: decision") and "agent model" not in md


# ------------------------------------------------------------------ a run that finished nothing records nothing (issue 38)
def test_a_study_that_finished_nothing_leaves_no_settings_record(tmp_path):
    from attnprobe.errors import ModelNotFoundError

    def no_model():
        raise ModelNotFoundError("model 'x' is not available locally")

    def down(messages, tools):
        raise RuntimeError("endpoint down")

    cfg = LoopConfig("ircot", ircot_form="chat", max_turns=3)
    with pytest.raises(ModelNotFoundError):  # exit 3: no model loaded
        run_study(LocalExecutor(no_model, progress=False), tmp_path, QUESTIONS, ["none"], cfg, n_boot=10, model="a")
    assert not (tmp_path / SETTINGS_FILE).exists()
    counts, _ = run_study(LocalExecutor(lambda: ScriptedChat(down), progress=False), tmp_path, QUESTIONS, ["none"],
                          cfg, n_boot=10, model="a")  # every item fails
    assert counts["done"] == 0 and counts["failed"] == len(QUESTIONS)
    assert not (tmp_path / SETTINGS_FILE).exists()
    # the corrected command (another model) is not refused, and is recorded once it has finished something
    counts, _ = run_study(LocalExecutor(lambda: ScriptedChat(script), progress=False), tmp_path, QUESTIONS, ["none"],
                          LoopConfig("ircot", ircot_form="chat", max_turns=3), n_boot=10, model="b")
    assert counts["done"] == len(QUESTIONS)
    assert json.loads((tmp_path / SETTINGS_FILE).read_text())["study interference"]["model"] == "b"


# ------------------------------------------------------------------ the corpus by its content (issue 38, item 4)
def _corpus(path, city):
    docs = [{"id": "d1", "title": "France", "url": "https://x/france", "text": f"The capital of France is {city}."},
            {"id": "d2", "title": "Spain", "url": "https://x/spain", "text": "The capital of Spain is Madrid."}]
    path.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    return str(path)


def test_a_changed_corpus_reruns_and_a_moved_identical_one_does_not(tmp_path):
    def searcher(messages, tools):
        return ("<think>x</think><answer>done</answer>" if len(messages) > 1
                else "<think>x</think><search>capital of France</search>")

    q = [{"id": "q1", "question": "Capital of France?", "answers": ["Paris"], "type": None}]

    def run(corpus):
        cfg = LoopConfig("ircot", ircot_form="chat", max_turns=2, top_k=1, corpus=corpus)
        return run_study(LocalExecutor(lambda: ScriptedChat(searcher), progress=False), tmp_path / "s", q, ["none"],
                         cfg, n_boot=10)[0]

    first = _corpus(tmp_path / "a.jsonl", "Paris")
    assert run(first)["done"] == 1
    moved = tmp_path / "elsewhere" / "docs.jsonl"
    moved.parent.mkdir()
    (tmp_path / "a.jsonl").rename(moved)
    assert run(str(moved)) == {"done_before": 1, "done": 0, "failed": 0}  # the same bytes at another path
    _corpus(moved, "Lutetia")  # rewritten in place
    assert run(str(moved)) == {"done_before": 0, "done": 1, "failed": 0}
    history = json.loads((tmp_path / "s" / "none" / "history" / "q1.jsonl").read_text())
    assert "The capital of France is Lutetia." in json.dumps(history)
    result = json.loads((tmp_path / "s" / "none" / "results" / "q1.json").read_text())
    assert result["config"]["corpus"].startswith("sha256:") and str(moved) not in json.dumps(result)


def test_a_run_killed_after_its_first_item_has_recorded_its_settings(tmp_path):
    def killed_at_q1(messages, tools):
        if "item 1" in messages[0]["content"]:
            raise KeyboardInterrupt  # the run dies here (no executor catches it)
        return script(messages, tools)

    with pytest.raises(KeyboardInterrupt):
        run_study(LocalExecutor(lambda: ScriptedChat(killed_at_q1), progress=False), tmp_path, QUESTIONS, ["none"],
                  LoopConfig("ircot", ircot_form="chat", max_turns=3), n_boot=10, model="a")
    assert json.loads((tmp_path / SETTINGS_FILE).read_text())["study interference"]["model"] == "a"
    with pytest.raises(AttnprobeError, match="--model/--served-model was 'a', now 'b'"):  # q0 was made with 'a'
        run_study(LocalExecutor(lambda: ScriptedChat(script), progress=False), tmp_path, QUESTIONS, ["none"],
                  LoopConfig("ircot", ircot_form="chat", max_turns=3), n_boot=10, model="b")


def test_study_attention_command_runs_through_the_driver(tmp_path, monkeypatch, capsys):
    """`attnprobe study attention` end to end on a scripted study, its executor one that captures nothing (the
    adapter's one function patched): the options record reaches the study, attention.md is printed and the
    count line ends stderr; --only-setting keeps one setting."""
    import contextlib

    from attnprobe.cli import adapter
    from attnprobe.cli.main import main

    class NoCapture:
        def call(self, fn, names, opts):
            return {n: {} for n in names}

        def run(self, job):
            return {"done_before": 0, "done": 0, "failed": 0}

    monkeypatch.setattr(adapter, "open_executor", lambda args, **kw: contextlib.nullcontext(NoCapture()))
    _run(tmp_path, settings=("none", "ircot:o"))
    capsys.readouterr()
    assert main(["study", "attention", str(tmp_path), "--model", "default", "--only-setting", "ircot:o",
                 "--min-past", "0", "--bootstrap", "10", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == (tmp_path / ATTENTION_MD).read_text().strip()
    assert err.strip().splitlines()[-1] == (f"study attention: 0 calls captured, 0 already done, 0 failed; 0 "
                                            f"counterfactual steps failed -> {tmp_path / ATTENTION_MD}")
    doc = json.loads((tmp_path / ATTENTION_JSON).read_text())
    assert list(doc["settings"]) == ["ircot:o"] and doc["bootstrap"]["resamples"] == 10
