"""The runner output's layout (issue 28): its file names spelled only in studies/runner/layout.py, the one
results reader (a bad line is one error naming file, line and field), the done rule (same question text
and gold answers) and no symlink below the output's folder followed. Hand-written files, no model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.spelled import outside, spelled

from attnprobe.errors import AttnprobeError
from attnprobe.io import OutsideFolder
from attnprobe.studies.runner import layout as RL
from attnprobe.studies.runner.layout import RunnerLayout

NAMES = [RL.RESULTS_SUFFIX, RL.SUMMARY_SUFFIX, RL.HISTORY_SUFFIX]
Q = {"id": "q1", "question": "Who?", "answers": ["Ada"]}


def test_the_output_names_are_spelled_only_in_layout_py():
    found = spelled(NAMES)
    assert outside(found, {n: ("attnprobe/studies/runner/layout.py",) for n in NAMES}) == {}
    assert {n: len(v) for n, v in found.items()} == {n: 1 for n in NAMES}


def test_paths_sit_beside_the_calls_file(tmp_path):
    layout = RunnerLayout(tmp_path / "runs" / "base.jsonl")
    assert layout.folder == tmp_path / "runs"
    assert layout.files() == (tmp_path / "runs" / "base.jsonl", tmp_path / "runs" / "base.results.ndjson",
                              tmp_path / "runs" / "base.summary.json", tmp_path / "runs" / "base.history.jsonl")
    assert layout.errors == tmp_path / "runs" / "errors.jsonl"
    assert RunnerLayout.is_folder({"base.jsonl", "base.results.ndjson"}) and not RunnerLayout.is_folder({"a.jsonl"})
    app = RunnerLayout(Path("runs/base.jsonl"), tmp_path)  # rooted (a reader in the app's data directory)
    assert app.results == (tmp_path / "runs" / "base.results.ndjson").resolve()


def _write(layout: RunnerLayout, *records) -> None:
    layout.folder.mkdir(parents=True, exist_ok=True)
    layout.results.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


def test_the_results_reader_keeps_the_last_line_of_a_run_and_names_a_bad_line(tmp_path):
    layout = RunnerLayout(tmp_path / "r.jsonl")
    assert layout.read_results() == {}  # nothing run yet
    first = {"run_id": "b-q1", "question": "Who?", "gold": ["Ada"], "answer": "Bob"}
    again = {**first, "answer": "Ada"}
    _write(layout, first, again)
    assert layout.read_results() == {"b-q1": again}
    _write(layout, first, {"question": "Who?"})
    with pytest.raises(AttnprobeError) as exc:
        layout.read_results()
    assert str(exc.value) == f"{layout.results}, line 2: field 'run_id' is missing or not a string"
    _write(layout, first, "[1]")
    with pytest.raises(AttnprobeError, match=r"line 2: not a JSON object \(list\)"):
        layout.read_results()


@pytest.mark.parametrize("record, want", [
    ({"run_id": "b-q1", "question": "Who?"}, None),
    ({"run_id": 3, "question": "Who?"}, "field 'run_id' is missing or not a string"),
    ({"run_id": "b-q1"}, "field 'question' is missing or not a string"),
    ("b-q1", "not a JSON object (str)"),
])
def test_problem(record, want):
    assert RunnerLayout.problem(record) == want


def test_done_needs_the_same_question_and_gold(tmp_path):
    done = {"b-q1": {"run_id": "b-q1", "question": "Who?", "gold": ["Ada"]}}
    assert RunnerLayout.done(done, "b-q1", Q)
    assert not RunnerLayout.done(done, "b-q2", Q)  # missing
    assert not RunnerLayout.done(done, "b-q1", {**Q, "question": "Who, then?"})  # the text changed
    assert not RunnerLayout.done(done, "b-q1", {**Q, "answers": ["Grace"]})  # the gold changed
    assert RunnerLayout.done({"b-q1": {**done["b-q1"], "gold": None}}, "b-q1", {**Q, "answers": []})


def test_a_symlinked_results_file_is_refused(tmp_path):
    secret = tmp_path / "secret.ndjson"
    secret.write_text(json.dumps({"run_id": "b-q1", "question": "Who?"}) + "\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "r.results.ndjson").symlink_to(secret)
    with pytest.raises(OutsideFolder, match="r.results.ndjson: is a symlink inside"):
        RunnerLayout(tmp_path / "runs" / "r.jsonl").read_results()
