"""The IBIS model folder's layout (issue 28): its names spelled only in studies/ibis/layout.py, one
validator of run.json, one reader shared by the study, the CLI and the app, the behaviour and attention
done rules, and paths kept inside the app's data directory. Hand-built folders, no model."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from support.spelled import outside, spelled

from attnprobe.errors import AttnprobeError
from attnprobe.io import OutsideFolder
from attnprobe.studies.ibis import layout as L
from attnprobe.studies.ibis.layout import CompareLayout, ModelFolderLayout
from attnprobe_app import data as D

NAMES = [L.ITEMS_FILE, L.DECISIONS_FILE, L.FRAMINGS_FILE, L.RUN_FILE, L.METRICS_FILE, L.ATTENTION_INDEX,
         L.ATTENTION_ARRAYS, L.REPORT_MD, L.REPORT_HTML, L.CAPTURES_DIR, L.COMPARE_JSON, L.COMPARE_FLIPS_JSON,
         L.COMPARE_MD, L.COMPARE_HTML]
# other folders' files of the same name: the loop study's attention.json, the capture report's report.html,
# the masking study's captures/ (and the capture report's "captures" label)
OTHERS = {L.ATTENTION_INDEX: ("attnprobe/studies/loop/", "app/study_data.py", "app/views/study.py"),
          L.REPORT_HTML: ("attnprobe/results/report.py",),
          L.CAPTURES_DIR: ("attnprobe/studies/masking/", "attnprobe/cli/study.py", "attnprobe/results/report.py")}


def test_the_folder_names_are_spelled_only_in_layout_py():
    allowed = {n: ("attnprobe/studies/ibis/layout.py", *OTHERS.get(n, ())) for n in NAMES}
    assert outside(spelled(NAMES), allowed) == {}
    assert {n: len(v) for n, v in spelled(NAMES).items() if n not in OTHERS} == {n: 1 for n in NAMES
                                                                                 if n not in OTHERS}


# ------------------------------------------------------------------ problem()
GOOD_RUN = {"model": "m", "protocol": "matched", "reminder": "identical", "variant": {"dtype": "float32"},
            "stages": {}, "items_sha256": "abc"}


def test_problem_accepts_a_good_run_and_a_minimal_one():
    assert ModelFolderLayout.problem(GOOD_RUN) is None
    assert ModelFolderLayout.problem({}) is None  # a folder from before run.json had fields
    assert ModelFolderLayout.problem({**GOOD_RUN, "reminder": None}) is None


@pytest.mark.parametrize("change, want", [
    ({"model": 3}, "field 'model' is int, not a string"),
    ({"protocol": ["paper"]}, "field 'protocol' is list, not a string"),
    ({"protocol": "mine"}, "field 'protocol' is 'mine', not one of paper, matched"),
    ({"reminder": 1.5}, "field 'reminder' is float, not a string"),
    ({"variant": "float32"}, "field 'variant' is str, not an object"),
    ({"stages": []}, "field 'stages' is list, not an object"),
    ({"items_sha256": 12}, "field 'items_sha256' is int, not a string"),
])
def test_problem_names_each_bad_field(change, want):
    assert ModelFolderLayout.problem({**GOOD_RUN, **change}) == want


def test_problem_refuses_a_non_object():
    assert ModelFolderLayout.problem([1]) == "expected a JSON object, got list"


# ------------------------------------------------------------------ the CLI and the app agree
def _folder(root: Path, run: dict | None = None) -> Path:
    folder = root / "ibis" / "m"
    folder.mkdir(parents=True)
    (folder / L.ITEMS_FILE).write_text(json.dumps({"id": "x1", "label": "should_research"}) + "\n")
    (folder / L.DECISIONS_FILE).write_text(
        json.dumps({"item_id": "x1", "framing": "agentic", "decision": "web_search", "method": "call",
                    "correct": True, "expected": "web_search", "readout": "call"}) + "\n")
    (folder / L.RUN_FILE).write_text(json.dumps(GOOD_RUN if run is None else run))
    return folder


def test_the_app_and_the_cli_get_the_same_paths(tmp_path):
    folder = _folder(tmp_path)
    cli, app = ModelFolderLayout(folder), ModelFolderLayout(Path("ibis/m"), tmp_path)
    for prop in ("items", "decisions", "run", "metrics", "attention_index", "attention_arrays", "captures",
                 "report_md", "report_html", "framings"):
        assert getattr(cli, prop).resolve() == getattr(app, prop), prop
    assert cli.capture("x1", "agentic") == folder / "captures" / "x1" / "agentic"
    assert app.capture("x1", "agentic") == (folder / "captures" / "x1" / "agentic").resolve()
    assert cli.read_run() == app.read_run() == GOOD_RUN
    assert [d["item_id"] for d in cli.read_decisions()] == [d["item_id"] for d in app.read_decisions()] == ["x1"]


def test_the_app_and_the_cli_refuse_the_same_run_json(tmp_path):
    from attnprobe.studies.ibis.folder import update_run

    folder = _folder(tmp_path, {**GOOD_RUN, "variant": ["float32"]})
    with pytest.raises(AttnprobeError) as cli:
        update_run(folder, "behaviour", {})  # the study reads run.json before recording a stage
    assert str(cli.value) == f"{folder / 'run.json'}: field 'variant' is list, not an object"
    ib = D.load_ibis(tmp_path, "ibis/m")
    assert ib.problems == ["ibis/m/run.json: field 'variant' is list, not an object"]
    assert ib.run == {} and [d["item_id"] for d in ib.decisions] == ["x1"]


def test_is_folder_is_what_discovery_uses(tmp_path):
    assert ModelFolderLayout.is_folder({"items.jsonl", "metrics.json"})
    assert not ModelFolderLayout.is_folder({"items.jsonl", "framings.jsonl"})  # prepared, nothing run
    assert not ModelFolderLayout.is_folder({"decisions.jsonl"})
    assert CompareLayout.is_folder({"compare.json"}) and not CompareLayout.is_folder({"compare.md"})
    _folder(tmp_path)
    (tmp_path / "cmp").mkdir()
    (tmp_path / "cmp" / "compare.json").write_text("[]")
    inv = D.discover(tmp_path)
    assert inv.ibis == ["ibis/m"] and inv.compares == ["cmp"]
    assert D.load_compare(tmp_path, "cmp") == []
    (tmp_path / "cmp" / "compare.json").write_text('{"a": 1}')
    with pytest.raises(D.DataError, match=r"^cmp/compare.json: expected a list of rows \(one per model\)$"):
        D.load_compare(tmp_path, "cmp")


def test_a_record_without_item_or_framing_is_refused_by_the_cli_and_listed_by_the_app(tmp_path):
    folder = _folder(tmp_path)
    with open(folder / L.DECISIONS_FILE, "a") as f:
        f.write(json.dumps({"decision": "answer"}) + "\n")
    with pytest.raises(AttnprobeError, match="a record without item_id or framing"):
        ModelFolderLayout(folder).read_decisions()
    ib = D.load_ibis(tmp_path, "ibis/m")
    assert ib.problems == ["ibis/m/decisions.jsonl: a record without item_id or framing"]
    assert len(ib.decisions) == 1


def test_attention_arrays_that_disagree_with_the_index_are_refused(tmp_path):
    from safetensors.numpy import save_file

    folder = _folder(tmp_path)
    index = {"items": ["x1"], "categories": ["query", "results"], "framings": ["agentic"]}
    (folder / L.ATTENTION_INDEX).write_text(json.dumps(index))
    save_file({"mass.agentic": np.zeros((1, 2, 3, 4), np.float32)}, str(folder / L.ATTENTION_ARRAYS))
    got_index, arrays = ModelFolderLayout(folder).read_attention()
    assert got_index == index and arrays["mass.agentic"].shape == (1, 2, 3, 4)
    save_file({"mass.agentic": np.zeros((2, 2, 3, 4), np.float32)}, str(folder / L.ATTENTION_ARRAYS))
    want = "ibis/m/attention.safetensors: mass.agentic has shape (2, 2, 3, 4), expected (1, 2, layers, heads)"
    with pytest.raises(AttnprobeError) as exc:
        ModelFolderLayout(Path("ibis/m"), tmp_path).read_attention()
    assert str(exc.value) == want
    assert D.load_ibis(tmp_path, "ibis/m").problems == [want]


# ------------------------------------------------------------------ done()
def test_decision_done(tmp_path):
    folder = _folder(tmp_path)
    layout = ModelFolderLayout(folder)
    decided = layout.decided()
    assert decided == {("x1", "agentic")}
    assert layout.decision_done(decided, "x1", "agentic")
    assert not layout.decision_done(decided, "x1", "observer")  # missing
    assert not layout.decision_done(decided, "x1", "agentic", since=0.0)  # a retried shard: the driver appends


def test_capture_done(tmp_path):
    from attnprobe.results.result import META_FILE

    folder = _folder(tmp_path)
    layout = ModelFolderLayout(folder)
    assert not layout.capture_done("x1", "agentic")  # missing
    cap = layout.capture("x1", "agentic")
    cap.mkdir(parents=True)
    (cap / META_FILE).write_text("{}")
    assert layout.capture_done("x1", "agentic")
    old = time.time() - 100
    os.utime(cap / META_FILE, (old, old))
    assert not layout.capture_done("x1", "agentic", since=time.time() - 10)  # stale: written before this run
    assert layout.capture_done("x1", "agentic", since=old - 1)


def test_a_symlinked_captures_folder_is_refused(tmp_path):
    folder = _folder(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "x1" / "agentic").mkdir(parents=True)
    (elsewhere / "x1" / "agentic" / "meta.json").write_text("{}")
    (folder / L.CAPTURES_DIR).symlink_to(elsewhere)
    with pytest.raises(OutsideFolder, match="captures: is a symlink inside"):
        ModelFolderLayout(folder).capture_done("x1", "agentic")


# ------------------------------------------------------------------ the app's root
def test_a_symlink_out_of_the_data_directory_is_refused_for_the_app(tmp_path):
    data = tmp_path / "data"
    folder = _folder(data)
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"model": "not ours"}))
    (folder / L.METRICS_FILE).symlink_to(secret)
    with pytest.raises(OutsideFolder, match="outside the data directory"):
        ModelFolderLayout(Path("ibis/m"), data).read_metrics()
    ib = D.load_ibis(data, "ibis/m")
    assert ib.metrics is None
    assert len(ib.problems) == 1 and "ibis/m/metrics.json': it is outside the data directory" in ib.problems[0]
    with pytest.raises(D.PathEscapeError, match="outside the data directory"):
        D.load_ibis(data, "../secret.json")
    # inside the data directory a link is followed (the app's rule), in the CLI's folder it is not
    inside_link = data / "other.json"
    inside_link.write_text(json.dumps({"model": "ours"}))
    (folder / L.METRICS_FILE).unlink()
    (folder / L.METRICS_FILE).symlink_to(inside_link)
    assert ModelFolderLayout(Path("ibis/m"), data).read_metrics() == {"model": "ours"}
    with pytest.raises(OutsideFolder, match="metrics.json: is a symlink inside"):
        ModelFolderLayout(folder).read_metrics()
