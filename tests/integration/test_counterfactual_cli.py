"""``attnprobe counterfactual`` on the shipped long trajectory: one step, two policies, then a resume."""

from __future__ import annotations

import argparse
import json

import pytest
from support.paths import TRAJ_DIR

from attnprobe.cli import counterfactual as cli

pytestmark = pytest.mark.slow  # captures and resumes through the CLI (the tiny random-weight SmolLM2)


def parse(argv):
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return parser.parse_args(argv)


def test_cli_runs_and_resumes(tiny_smol_folder, tmp_path, capsys):
    out = tmp_path / "cf"
    argv = ["counterfactual", str(TRAJ_DIR / "long_research.jsonl"), "--policy", "ircot:oqp", "--policy", "mask:3",
            "--min-past", "5", "--max-steps", "1", "--out", str(out), "--no-progress", "--model", str(tiny_smol_folder)]
    args = parse(argv)
    assert args.func(args) == 0
    steps = sorted(p.parent.relative_to(out).as_posix() for p in out.glob("*/*/step_*/record.json"))
    assert len(steps) == 2 and all(s.endswith("/step_0012") for s in steps)  # turn 5 = message 12
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"ircot:oqp", "mask:3"} and summary["ircot:oqp"]["steps"] == 1
    rec = json.loads(next(out.glob("*/ircot_oqp*/step_0012/record.json")).read_text())
    # ircot:oqp keeps system, task and the latest turn (messages 10, 11) before step 12
    assert [k for k, v in rec["changes"].items() if v == "kept"] == ["0", "1", "10", "11"]
    assert rec["tokens"]["saved"] > 1000
    assert abs(sum(rec["queries"]["decision"]["redistribution"].values()) - rec["queries"]["decision"]["changed_message_mass"]) < 1e-5
    mtime = next(out.glob("*/mask_3*/step_0012/record.json")).stat().st_mtime_ns
    # Rerun: everything is done, nothing is recomputed.
    args = parse(argv)
    assert args.func(args) == 0
    assert next(out.glob("*/mask_3*/step_0012/record.json")).stat().st_mtime_ns == mtime
    assert "| mask:3 | 1 |" in capsys.readouterr().out


def test_cli_bad_policy_is_one_clear_error(tmp_path):
    args = parse(["counterfactual", str(TRAJ_DIR / "long_research.jsonl"), "--policy", "mask:x", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="^policy 'mask:x': K must be an integer"):
        args.func(args)


def _small(tmp_path, name="t.jsonl", **change):
    """The first shipped reasoning_content trajectory (short), optionally with one message changed."""
    src = json.loads((TRAJ_DIR / "reasoning_content.jsonl").read_text(encoding="utf-8").splitlines()[0])
    for i, text in change.items():
        src["messages"][int(i.lstrip("m"))]["content"] = text
    path = tmp_path / name
    path.write_text(json.dumps(src) + "\n", encoding="utf-8")
    return path, src


def test_resume_redoes_damaged_stale_and_half_built_steps(tiny_smol_folder, tmp_path, caplog):
    """A step counts as done only when every file is there, made from the same trajectory content
    with the same settings and weights; what an interrupted writer left is cleaned up."""
    path, src = _small(tmp_path)
    out = tmp_path / "cf"
    argv = ["counterfactual", str(path), "--policy", "mask:1", "--min-past", "2", "--max-steps", "1", "--out",
            str(out), "--no-progress", "--model", str(tiny_smol_folder)]

    def run():
        args = parse(argv)
        assert args.func(args) == 0

    run()
    (step,) = out.glob("*/mask_1*/step_*")
    record = json.loads((step / "record.json").read_text())
    assert record["trajectory_hash"] and len(record["settings"]["weights"]) == 16
    stamp = (step / "record.json").stat().st_mtime_ns
    run()  # all done: untouched
    assert (step / "record.json").stat().st_mtime_ns == stamp
    (step / "masses.safetensors").unlink()  # damaged: redone
    run()
    assert (step / "masses.safetensors").is_file() and (step / "record.json").stat().st_mtime_ns > stamp
    stamp = (step / "record.json").stat().st_mtime_ns
    half = step.parent / f".{step.name}.tmp-dead01"  # a SIGKILLed writer's work folder
    (half / "original").mkdir(parents=True)
    run()
    assert not half.exists() and (step / "record.json").stat().st_mtime_ns == stamp
    # the same id with other content (an observation edited): the step is stale, redone
    observation = next(i for i, m in enumerate(src["messages"]) if m["role"] == "tool")
    _small(tmp_path, **{f"m{observation}": "changed observation text"})
    run()
    assert (step / "record.json").stat().st_mtime_ns > stamp
    assert json.loads((step / "record.json").read_text())["trajectory_hash"] != record["trajectory_hash"]


def test_the_same_id_in_two_files_is_refused_before_any_work(tmp_path):
    a, _ = _small(tmp_path, "a.jsonl")
    b, _ = _small(tmp_path, "b.jsonl")
    args = parse(["counterfactual", str(a), str(b), "--out", str(tmp_path / "cf")])
    from attnprobe.errors import TrajectoryError

    with pytest.raises(TrajectoryError, match="duplicate trajectory id .* also at .*a.jsonl"):
        args.func(args)
    assert not (tmp_path / "cf").exists()
