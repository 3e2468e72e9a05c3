"""Options that need no model are refused before it loads, in one short line (issue 27: '--min-past -1' was
accepted; '--layers 5-300000' printed 2.3 MB listing every missing layer; 'study masking' captured with the
model before checking its counterfactual steps; 'run' suggested the old '--overwrite')."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from attnprobe.capture.api import check_layers, int_ranges
from attnprobe.cli.main import MAX_ERROR_CHARS, main, shorten
from attnprobe.resources import data_path

NO_MODEL = "/nonexistent/model-folder"
TRAJ = str(data_path("long_research.jsonl"))


def _err(capsys) -> str:
    return capsys.readouterr().err


def _one_short_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("attnprobe") or "error" in ln]
    assert lines and all(len(ln) <= MAX_ERROR_CHARS for ln in err.splitlines()), err[:500]
    return lines[-1]


@pytest.mark.parametrize("argv, needle", [
    (["counterfactual", TRAJ, "--out", "o", "--min-past", "-1"], "--min-past: must be 0 or more, got -1"),
    (["study", "attention", "o", "--min-past", "-1"], "--min-past: must be 0 or more, got -1"),
    (["counterfactual", TRAJ, "--out", "o", "--max-new-tokens", "0"], "--max-new-tokens: must be at least 1"),
    (["ibis", "run", "--prompts-per-batch", "0"], "--prompts-per-batch: must be at least 1"),
    (["ibis", "report", "--bootstrap", "-5"], "--bootstrap: must be at least 1"),
    (["counterfactual", TRAJ, "--out", "o", "--ray-cpus-per-replica", "-1"], "must be a finite number >= 0"),
])
def test_negative_numbers_are_refused_while_parsing(capsys, argv, needle):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and needle in _one_short_line(_err(capsys))


@pytest.mark.parametrize("policies, needle", [
    (["mask: 2"], "--policy 'mask: 2': contains a space"),
    (["mask:2+"], "--policy 'mask:2+': an empty part"),
    (["none+mask:2"], "'none' (no policy) cannot be composed"),
    (["mask:5", "mask:05"], "--policy 'mask:05' is the same setting as 'mask:5'"),
    (["refine:openai:ftp://h/v1:m"], "must be an http:// or https:// URL"),
])
def test_study_interference_refuses_settings_before_the_model(tmp_path, capsys, policies, needle):
    argv = ["study", "interference", str(data_path("questions_loop.jsonl")), "--scaffold", "seed002",
            "--model", NO_MODEL, "--out", str(tmp_path / "s")]
    for p in policies:
        argv += ["--policy", p]
    assert main(argv) == 2  # exit 3 would mean the model was looked for first
    assert needle in _one_short_line(_err(capsys))


def test_counterfactual_refuses_a_bad_policy_before_the_model(tmp_path, capsys):
    assert main(["counterfactual", TRAJ, "--policy", "mask:\u0663", "--model", NO_MODEL,
                 "--out", str(tmp_path / "o")]) == 2
    assert "non-ASCII" in _one_short_line(_err(capsys))


def test_study_masking_checks_its_steps_before_the_capture_stage(tmp_path, capsys):
    assert main(["study", "masking", TRAJ, "--turns", "999", "--model", NO_MODEL, "--out", str(tmp_path / "s")]) == 2
    assert "no step qualifies" in _one_short_line(_err(capsys))
    assert not (tmp_path / "s" / "captures").exists()  # exit 2, not 3: the model was never looked for


def test_missing_layers_are_printed_as_ranges():
    model = SimpleNamespace(num_layers=30)
    with pytest.raises(ValueError) as exc:
        check_layers(model, range(5, 300_001))
    assert str(exc.value) == "layers 30-300000 do not exist (the model has 30 layers: 0-29)"
    assert int_ranges([0, 1, 2, 3, 7, 9, 10, 11, 12]) == "0-3,7,9-12"
    assert int_ranges(range(0, 40, 2), most=3) == "0,2,4,... (17 more ranges)"
    assert check_layers(model, [3, 1, 3]) == [1, 3]


def test_a_huge_bad_value_gives_a_short_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["capture", TRAJ, "--layers", "1-2," + "x" * 1_000_000, "--out", str(tmp_path)])
    line = _one_short_line(_err(capsys))
    assert line.startswith("attnprobe capture: error: argument --layers: ")
    assert main(["counterfactual", TRAJ, "--policy", "y" * 1_000_000, "--out", str(tmp_path / "o")]) == 2
    assert "unknown policy" in _one_short_line(_err(capsys))
    long = shorten("word " * 10_000)
    assert len(long) == MAX_ERROR_CHARS and long.startswith("word word") and long.endswith("word word")
    assert " [... 49631 characters cut ...] " in long and shorten("a\n b") == "a b"


def test_run_suggests_force_not_the_old_option(tmp_path, capsys):
    out = tmp_path / "o.jsonl"  # a run resumes by default (issue 28): records of other settings are refused
    out.with_suffix(".results.ndjson").write_text('{"run_id": "x", "settings": {"filter": "none"}}\n')
    assert main(["run", str(data_path("questions.jsonl")), "--model", NO_MODEL, "--out", str(out)]) == 2
    line = _one_short_line(_err(capsys))
    assert "--force" in line and "--overwrite" not in line


def test_counterfactual_specs_are_planned_in_their_one_spelling():
    from pathlib import Path

    from attnprobe.cli.counterfactual import step_choice
    from attnprobe.cli.main import build_parser

    args = build_parser().parse_args(["counterfactual", TRAJ, "--out", "o", "--policy", "mask:03",
                                      "--policy", "refine:bm25"])
    specs, min_past, names, _ = step_choice(args).plan([Path(TRAJ)])
    assert specs == names == ["mask:3", "refine:bm25:3"] and min_past == 1
    args.policies = ["mask:3", "mask:03"]
    with pytest.raises(ValueError, match="policy names must be distinct"):
        step_choice(args).plan([Path(TRAJ)])
