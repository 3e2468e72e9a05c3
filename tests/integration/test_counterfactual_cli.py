"""``attnprobe counterfactual`` on the shipped long trajectory: one step, two policies, then a resume."""

from __future__ import annotations

import argparse
import json

import pytest
from support.paths import TRAJ_DIR

from attnprobe.cli import counterfactual as cli

pytestmark = pytest.mark.slow  # two captures of a 1.6k-token prefix (~20 s idle)


def parse(argv):
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return parser.parse_args(argv)


def test_cli_runs_and_resumes(smol, tmp_path, capsys):
    out = tmp_path / "cf"
    argv = ["counterfactual", str(TRAJ_DIR / "long_research.jsonl"), "--policy", "ircot:oqp", "--policy", "mask:3",
            "--max-steps", "1", "--out", str(out), "--no-progress"]
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
    assert abs(sum(rec["queries"]["decision"]["redistribution"].values()) - rec["queries"]["decision"]["removed_mass"]) < 1e-5
    mtime = next(out.glob("*/mask_3*/step_0012/record.json")).stat().st_mtime_ns
    # Rerun: everything is done, nothing is recomputed.
    args = parse(argv)
    assert args.func(args) == 0
    assert next(out.glob("*/mask_3*/step_0012/record.json")).stat().st_mtime_ns == mtime
    assert "| mask:3 | 1 |" in capsys.readouterr().out


def test_cli_bad_policy_is_one_clear_error(tmp_path):
    args = parse(["counterfactual", str(TRAJ_DIR / "long_research.jsonl"), "--policy", "mask:x", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="--policy 'mask:x': K must be an integer"):
        args.func(args)
