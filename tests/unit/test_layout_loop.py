"""Issue 28: the interference and masking studies own their folder layouts (studies/loop/layout.py,
studies/masking/layout.py). Their file names are spelled only there; the CLI and the app get the same paths and
the same validation answer from one StudyLayout; problem() on hand-built study.json (each check); done() on
hand-built folders; a symlink out of the app's data directory is refused. Hand-built folders, no model."""

from __future__ import annotations

import ast
import json
import math
import os
import time
from pathlib import Path

import pytest
from support.spelled import outside, spelled
from support.studydir import BASE, OTHER, make_study

from attnprobe.errors import AttnprobeError
from attnprobe.io import OutsideFolder
from attnprobe.studies.loop import layout as L
from attnprobe.studies.loop.layout import StudyLayout
from attnprobe.studies.masking import layout as M
from attnprobe.studies.masking.layout import MaskingLayout

REPO = Path(__file__).resolve().parents[2]
LAYOUTS = ("attnprobe/studies/loop/layout.py", "attnprobe/studies/masking/layout.py")
EXCLUSIVE = [L.STUDY_JSON, L.STUDY_MD, L.ATTENTION_MD, L.CALLS_JSONL, M.CAPTURES]  # only these studies' names
# the IBIS model folder has an attention.json of its own (its layout's; on this branch still app/data.py's and
# app/common.py's IBIS loader), and "captures" is also its captures folder
OTHERS = {L.ATTENTION_JSON: ("attnprobe/studies/ibis/", "app/data.py", "app/common.py"),
          M.CAPTURES: ("attnprobe/studies/ibis/", "attnprobe/results/report.py")}
FOLDER_NAMES = {L.CALLS, L.HISTORY, L.RESULTS, L.CAPTURE, M.CAPTURES, L.COUNTERFACTUAL, L.ATTENTION_JSON}
# the modules of the two studies, their CLI and the app's Study page: no path join spells a folder name there
OWNED = ("attnprobe/studies/loop/", "attnprobe/studies/masking/", "attnprobe/cli/loop.py", "attnprobe/cli/study.py",
         "app/study_data.py", "app/common.py", "app/views/study.py")


def _joined(path: Path):
    """(line, value, enclosing function) of every string constant of a module that is an operand of ``/`` (a
    path join) or is "attention.json" (only modules whose text quotes a folder name are parsed)."""
    text = path.read_text(encoding="utf-8")
    if not any(f'"{n}"' in text or f"'{n}'" in text for n in FOLDER_NAMES):
        return []
    tree = ast.parse(text)
    joined = {id(n) for b in ast.walk(tree) if isinstance(b, ast.BinOp) and isinstance(b.op, ast.Div)
              for n in (b.left, b.right)}
    out = []

    def visit(node, func):
        for child in ast.iter_child_nodes(node):
            f = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if isinstance(child, ast.Constant) and child.value in FOLDER_NAMES and \
                    (id(child) in joined or child.value == L.ATTENTION_JSON):
                out.append((child.lineno, child.value, func))
            visit(child, f)

    visit(tree, None)
    return out


def test_the_folder_names_are_spelled_only_in_the_layouts():
    """Every literal naming study.json, study.md, attention.md, calls.jsonl or captures (as the literal or a
    part of a path: tests/support/spelled.py) in attnprobe/ and app/ is in a layout.py (attention.json and
    captures also in the IBIS folder's modules); in the two studies, their CLI and the Study page no path join
    spells a folder name ("calls", "capture", ...) and no literal is "attention.json" (app/common.py's IBIS
    loader aside). Today's main spells them in 10 modules."""
    allowed = {n: (*LAYOUTS, *OTHERS.get(n, ())) for n in [*EXCLUSIVE, L.ATTENTION_JSON]}
    assert outside(spelled([*EXCLUSIVE, L.ATTENTION_JSON]), allowed) == {}
    joins = [f"{rel}:{line} {value}" for path in sorted([*(REPO / "attnprobe").rglob("*.py"), *(REPO / "app").rglob("*.py")])
             if (rel := path.relative_to(REPO).as_posix()).startswith(OWNED) and rel not in LAYOUTS
             for line, value, func in _joined(path) if not (rel == "app/common.py" and func in ("ibis", "_ibis"))]
    assert joins == []


# ------------------------------------------------------------------ the CLI and the app: one layout
@pytest.fixture
def data(tmp_path) -> Path:
    root = tmp_path / "data"
    make_study(root / "study")
    return root.resolve()


def test_the_cli_and_the_app_get_the_same_paths_and_the_same_study(data):
    from attnprobe_app import study_data as SD

    cli, app = StudyLayout(data / "study"), StudyLayout(data / "study", root=data)
    for s in (BASE, OTHER):
        assert cli.setting_dir(s) == app.setting_dir(s) == data / "study" / StudyLayout.setting_name(s)
        for get in ("calls", "history", "result"):
            assert getattr(cli, get)(s, "q1") == getattr(app, get)(s, "q1")
        assert cli.result(s, "q1") == data / "study" / StudyLayout.setting_name(s) / "results" / "q1.json"
        assert (cli.capture_dir(s), cli.counterfactual_dir(s), cli.calls_file(s)) == \
            (app.capture_dir(s), app.counterfactual_dir(s), app.calls_file(s))
    assert StudyLayout.setting_name(OTHER) == "mask-1_refine-bm25-a01c95f0"
    study = SD.load_study(data, "study")
    assert study.data == cli.read_study() == app.read_study(stamps=False)
    assert (study.settings, study.baseline) == ([BASE, OTHER], BASE)
    # the app's per-call capture path leads back to the same setting folder
    st = StudyLayout.of_capture(f"study/{StudyLayout.setting_name(OTHER)}/capture/x", root=data)
    assert st.calls("q1") == cli.calls(OTHER, "q1") and st.calls_dir == cli.setting(OTHER).calls_dir
    assert StudyLayout.of_capture("study/x/captures/y", root=data) is None
    assert StudyLayout.is_folder({"study.json", "study.md"}) and not StudyLayout.is_folder({"items.jsonl"})


def test_the_app_and_study_attention_refuse_a_bad_study_json_with_the_same_line(data):
    """One validator: a study.json whose number the page cannot show is refused by ``study attention`` too
    (on main, study attention read it; the app skipped it)."""
    from attnprobe.studies.loop.attention import read_study
    from attnprobe_app import data as D
    from attnprobe_app import study_data as SD

    path = data / "study" / "study.json"
    study = json.loads(path.read_text())
    study["settings"][BASE]["art"] = "many"
    path.write_text(json.dumps(study))
    why = "'settings.none.art' is 'many', not a finite number"
    with pytest.raises(D.DataError) as app_err:
        SD.load_study(data, "study")
    with pytest.raises(AttnprobeError) as cli_err:
        read_study(data / "study")
    assert str(app_err.value) == f"study/study.json: {why}"
    assert str(cli_err.value) == f"{path}: {why}"
    assert SD.study_problem(study) == StudyLayout.problem(study) == why


# ------------------------------------------------------------------ problem(): each check
GOOD = {"settings": {"none": {"accuracy": 0.5, "accuracy_ci": [0.0, 1.0], "art": 2.0},
                     "mask:5": {"accuracy": 1.0}},
        "baseline": "none", "questions_total": 2, "config": {"scaffold": "ircot"}, "models": ["m"], "scorer": "em",
        "bootstrap": {"resamples": 10}, "paired": {"mask:5": {"fixed": ["q2"], "broken": []}},
        "questions": {"q1": {"correct": {"none": True}, "answer": {"none": "Paris"}}},
        "results": {"none": {"q1": "abc"}, "mask:5": {}}}


def _with(path: str, value):
    obj = json.loads(json.dumps(GOOD))
    *keys, last = path.split("/")
    cur = obj
    for k in keys:
        cur = cur[k]
    if value is KeyError:
        del cur[last]
    else:
        cur[last] = value
    return obj


@pytest.mark.parametrize("path, value, problem", [
    ("settings", [], "'settings' is not an object of per-setting summaries"),
    ("settings", {}, "'settings' is not an object of per-setting summaries"),
    ("settings/none", 3, "'settings.none' is not an object"),
    ("settings/none/art", "x", "'settings.none.art' is 'x', not a finite number"),
    ("settings/none/seconds", math.inf, "'settings.none.seconds' is inf, not a finite number"),
    ("settings/none/accuracy", True, "'settings.none.accuracy' is True, not a finite number"),
    ("settings/none/accuracy_ci", [0.1], "'settings.none.accuracy_ci' is [0.1], not [low, high]"),
    ("config", [], "'config' is list, not an object"),
    ("bootstrap", 5, "'bootstrap' is int, not an object"),
    ("models", "m", "'models' is str, not a list"),
    ("scorer", 1, "'scorer' is int, not a string"),
    ("questions_total", "2", "'questions_total' is '2', not a number"),
    ("baseline", KeyError, "'baseline' None is not one of the settings"),
    ("baseline", "other", "'baseline' 'other' is not one of the settings"),
    ("paired", [], "'paired' is not an object"),
    ("paired/mask:5", {"fixed": "q2"}, "'paired.mask:5' is not an object with 'fixed' and 'broken' lists"),
    ("questions", [], "'questions' is not an object"),
    ("questions/q1", {"correct": []}, "'questions.q1' is not an object with 'correct' and 'answer' objects"),
    ("results", {"none": {"q1": 3}}, "'results' is missing or not the stamps of the results (made by an older "
                                     "attnprobe); run 'attnprobe study interference' on this folder again first"),
])
def test_problem_names_the_field_of_each_check(path, value, problem):
    assert StudyLayout.problem(GOOD) is None and StudyLayout.problem(GOOD, stamps=True) is None
    assert StudyLayout.problem(_with(path, value)) == problem


def test_problem_wants_the_stamps_only_for_study_attention():
    old = _with("results", KeyError)  # a study.json from before issue 27 (two shipped ones): the page shows it
    assert StudyLayout.problem(old) is None
    assert StudyLayout.problem(old, stamps=True).startswith("'results' is missing")
    assert StudyLayout.problem([1]) == "expected a JSON object"


def test_read_study_refuses_a_missing_or_symlinked_study_json(tmp_path):
    out = tmp_path / "study"
    out.mkdir()
    with pytest.raises(AttnprobeError, match="not an interference study folder"):
        StudyLayout(out).read_study()
    (tmp_path / "real.json").write_text(json.dumps(GOOD))
    (out / "study.json").symlink_to(tmp_path / "real.json")
    with pytest.raises(OutsideFolder, match=r"study\.json: is a symlink inside"):
        StudyLayout(out).read_study()
    assert StudyLayout(out, root=tmp_path).read_study() == GOOD  # the app's rule: a link inside its root is read


# ------------------------------------------------------------------ done(): hand-built folders
def _result(layout: StudyLayout, spec: str, qid: str, **rec) -> Path:
    path = layout.result(spec, qid)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))
    return path


def test_done_is_the_stamp_the_fields_and_the_time(tmp_path):
    layout = StudyLayout(tmp_path / "out")
    fields = {"setting": "mask:5", "policy_rules": {"mask": "released"}}
    assert not layout.done("mask:5", "q1", "s1")  # missing
    path = _result(layout, "mask:5", "q1", inputs="s1", **fields)
    assert layout.done("mask:5", "q1", "s1", fields=fields)
    assert not layout.done("mask:5", "q1", "s2", fields=fields)  # a stale stamp: other inputs
    assert not layout.done("mask:5", "q1", "s1", fields={**fields, "policy_rules": {"mask": "other"}})
    assert not layout.done("mask:5", "q1", "s1", fields={**fields, "config": {"scaffold": "ircot"}})  # not recorded
    assert not layout.done("mask:5", "q1", "s1", since=time.time() + 60, fields=fields)  # written before `since`
    assert layout.done("mask:5", "q1", "s1", since=path.stat().st_mtime, fields=fields)
    path.write_text("{not json")
    assert not layout.done("mask:5", "q1", "s1", fields=fields)  # unreadable: redone
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps({"inputs": "s1", **fields}))
    path.unlink()
    path.symlink_to(real)
    assert not layout.done("mask:5", "q1", "s1", fields=fields)  # a symlinked result is not followed
    results = layout.setting_dir("mask:5") / "results"
    path.unlink()
    results.rmdir()
    results.symlink_to(tmp_path)  # a symlinked results folder: refused in one line, never read
    with pytest.raises(OutsideFolder, match=r"/mask-5/results: is a symlink inside"):
        layout.done("mask:5", "q1", "s1")


def test_the_jobs_done_is_the_layouts(tmp_path):
    from attnprobe.studies.loop.agents import LoopConfig
    from attnprobe.studies.loop.job import InterferenceJob, inputs_stamp, recorded_fields

    q = {"id": "q1", "question": "What?", "answers": ["x"], "type": None}
    config = LoopConfig("ircot", ircot_form="chat")
    job = InterferenceJob(tmp_path, [q], ["none"], config, model="m")
    [item] = job.items()
    assert not job.done(item)
    stamp = inputs_stamp(q, "none", config, "m")
    _result(job.layout, "none", "q1", inputs=stamp, **recorded_fields("none", config))
    assert job.done(item) and job.layout.done("none", "q1", stamp, fields=recorded_fields("none", config))
    assert not InterferenceJob(tmp_path, [q], ["none"], config, model="other").done(item)


def test_stamped_reads_only_the_records_of_current_results_in_question_order(tmp_path, caplog):
    layout = StudyLayout(tmp_path)
    calls = layout.setting("none").calls_dir
    calls.mkdir(parents=True)
    rec = lambda i, st: json.dumps({"id": i, "meta": {"inputs": st}}) + "\n"  # noqa: E731
    (calls / "q1.jsonl").write_text(rec("q1-old", "s0") + rec("q1-a", "s1") + rec("q1-b", "s1"))
    (calls / "q2.jsonl").write_text(rec("q2-a", "s2"))
    (tmp_path / "q3.jsonl").write_text(rec("q3-out", "s3"))
    (calls / "q3.jsonl").symlink_to(tmp_path / "q3.jsonl")
    got = layout.stamped("none", {"q2": "s2", "q1": "s1", "q3": "s3", "q4": "s4"})
    assert [(p.name, line, r["id"]) for p, line, r in got] == [("q2.jsonl", 1, "q2-a"), ("q1.jsonl", 2, "q1-a"),
                                                                ("q1.jsonl", 3, "q1-b")]
    assert "q3.jsonl: is a symlink; not followed" in caplog.text
    assert layout.stamped("none", {"q1": "s1"}, part="history") == []


# ------------------------------------------------------------------ the app's root
def test_the_apps_layout_refuses_a_symlink_out_of_its_data_directory(tmp_path, data):
    from attnprobe_app import data as D
    from attnprobe_app import study_data as SD

    outside = make_study(tmp_path / "elsewhere" / "study")
    folder = data / "study" / StudyLayout.setting_name(OTHER)
    for part in ("capture", "counterfactual"):
        (outside / StudyLayout.setting_name(OTHER) / part).mkdir(exist_ok=True)
    (folder / "counterfactual").symlink_to(outside / StudyLayout.setting_name(OTHER) / "counterfactual")
    app = StudyLayout(data / "study", root=data)
    with pytest.raises(OutsideFolder, match="outside the data directory"):
        app.counterfactual_dir(OTHER)
    assert not SD.has_counterfactuals(data, SD.load_study(data, "study"), OTHER)
    (folder / "counterfactual").unlink()
    (folder / "counterfactual").symlink_to(folder / "capture")  # inside the data directory: the app follows it
    assert app.counterfactual_dir(OTHER) == folder / "counterfactual"
    assert SD.has_counterfactuals(data, SD.load_study(data, "study"), OTHER)
    with pytest.raises(OutsideFolder, match="counterfactual: is a symlink inside"):  # the CLI follows none
        StudyLayout(data / "study").counterfactual_dir(OTHER)
    with pytest.raises(OutsideFolder, match="outside the data directory"):
        app.calls(BASE, "../../../../elsewhere/study/none/calls/q1")
    os.symlink(outside / "attention.md", data / "study" / "attention.json")
    with pytest.raises(OutsideFolder, match="outside the data directory"):
        app.read_attention()
    with pytest.raises(D.PathEscapeError, match="outside the data directory"):  # the page's error type
        SD.attention_summary(data, SD.load_study(data, "study"))


# ------------------------------------------------------------------ the masking study
def test_the_masking_layout(tmp_path):
    layout = MaskingLayout(tmp_path)
    assert (layout.captures_dir, layout.counterfactual_dir, layout.study_json, layout.study_md) == \
        (tmp_path / "captures", tmp_path / "counterfactual", tmp_path / "study.json", tmp_path / "study.md")
    good = {"headline": {"steps": 3}, "seed002": {}, "decay": {}, "counterfactual": {}}
    assert MaskingLayout.problem(good) is None
    assert MaskingLayout.problem({**good, "decay": []}) == "'decay' is list, not an object"
    assert MaskingLayout.problem({k: v for k, v in good.items() if k != "headline"}) == \
        "'headline' is NoneType, not an object"
    with pytest.raises(AttnprobeError, match="not a masking study folder"):
        layout.read_study()
    (tmp_path / "study.json").write_text(json.dumps(good))
    assert layout.read_study() == good
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "captures").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OutsideFolder, match="captures: is a symlink inside"):
        _ = layout.captures_dir


# ------------------------------------------------------------------ folder names are one-to-one (issue 38, item 2)
URL = "refine:openai:http://127.0.0.1:8000/v1"


@pytest.mark.parametrize("a, b", [(f"{URL}:a/b", f"{URL}:a_b"), ("refine:openai:http://h/v1:m", "refine:openai:http://h_v1:m"),
                                  ("refine:openai:http://h/v1:m-x", "refine:openai:http://h/v1-m:x"),
                                  ("refine:openai:http://h/v1:M", "refine:openai:http://h/v1:m")])
def test_two_settings_never_share_a_folder(tmp_path, a, b):
    from attnprobe.studies.loop.context import slug

    assert slug(a).lower() != slug(b).lower()
    assert StudyLayout(tmp_path).setting_dir(a) != StudyLayout(tmp_path).setting_dir(b)
    StudyLayout(tmp_path).check([a, b])  # no refusal


def test_folder_names_without_free_text_are_kept_and_with_it_are_readable():
    from attnprobe.studies.loop.context import slug

    assert [slug(s) for s in ("none", "mask:5", "mask-obs:2", "ircot:oqp", "refine:bm25:3", "ircot:oq+refine:bm25:3")] == [
        "none", "mask-5", "mask-obs-2", "ircot-oqp", "refine-bm25-3", "ircot-oq_refine-bm25-3-503a6f5b"]
    name = slug(f"{URL}:a/b")
    assert name.startswith("refine-openai-http-_127.0.0.1-8000_v1-a_b-") and len(name.rsplit("-", 1)[1]) == 12


def test_two_settings_that_would_share_a_folder_are_refused_before_anything_runs(tmp_path, monkeypatch, caplog):
    from attnprobe.studies.loop import context

    monkeypatch.setattr(L, "slug", lambda spec: "same")
    with pytest.raises(AttnprobeError, match=r"settings 'mask:1' and 'mask:2' would share the folder 'same'; run "
                                             r"them in two studies"):
        StudyLayout(tmp_path).check(["mask:1", "mask:2"])
    monkeypatch.undo()
    spec = f"{URL}:a/b"
    (tmp_path / context.legacy_slug(spec)).mkdir()  # a folder of the name before issue 38
    StudyLayout(tmp_path).check([spec])
    assert f"made by an older attnprobe under the folder name of setting {spec}" in caplog.text


def test_a_study_of_two_refiner_models_keeps_both_rows(tmp_path):
    from support.interference import run_interference as run_study
    from support.scripted_chat import ScriptedChat

    from attnprobe.execution.local import LocalExecutor
    from attnprobe.studies.loop.agents import LoopConfig

    a, b = f"{URL}:a/b", f"{URL}:a_b"
    q = {"id": "q1", "question": "Capital of France?", "answers": ["Paris"], "type": None}
    chat = ScriptedChat(lambda messages, tools: "<think>known</think><answer>Paris</answer>")
    counts, study = run_study(LocalExecutor(lambda: chat, progress=False), tmp_path, [q], [a, b],
                              LoopConfig("ircot", ircot_form="chat", max_turns=2), n_boot=10)
    assert counts["done"] == 2 and [study["settings"][s]["questions"] for s in (a, b)] == [1, 1]
    assert [json.loads(StudyLayout(tmp_path).result(s, "q1").read_text())["setting"] for s in (a, b)] == [a, b]
    assert run_study(LocalExecutor(lambda: chat, progress=False), tmp_path, [q], [a, b],
                     LoopConfig("ircot", ircot_form="chat", max_turns=2), n_boot=10)[0]["done_before"] == 2  # a rerun redoes neither
