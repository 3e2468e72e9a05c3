"""``study masking`` is a study module: the CLI makes its options record and leaves ``args`` as parsed."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnprobe.errors import AttnprobeError
from attnprobe.resources import data_path

TRAJ = str(data_path("long_research.jsonl"))


def _args(*extra):
    from attnprobe.cli.main import build_parser

    return build_parser().parse_args(["study", "masking", TRAJ, "--out", "o", "--chunk-size", "64", *extra])


def test_options_record_without_touching_args():
    from attnprobe.cli.study import masking_options

    args = _args("--policy", "mask:03", "--layers", "1,2")
    before = dict(vars(args))
    opts = masking_options(args)
    assert vars(args) == before  # before issue 28 the command set queries, save_qk_layers and truncate on args
    cap = opts.capture_options()
    assert (cap.queries, cap.save_qk_layers, cap.truncate, cap.chunk_size, cap.layers) == ("reasoning", [], False,
                                                                                          64, [1, 2])
    assert opts.choice.policies == ("mask:03",) and opts.out == Path("o")
    specs, min_past, names, steps = opts.choice.plan(opts.trajectories)
    assert specs == names == ["mask:3"] and min_past == 4 and len(steps) == 19  # mask:3 acts from turn 4 (mask:5 from 6: 17 steps)


def test_the_study_refuses_its_steps_before_any_stage(tmp_path):
    from attnprobe.cli.study import masking_options
    from attnprobe.execution.study import run_study
    from attnprobe.studies.masking import MASKING

    opts = masking_options(_args("--turns", "999", "--out", str(tmp_path / "o")))
    opened = []
    with pytest.raises(AttnprobeError, match="no step qualifies"):
        run_study(MASKING, opts, lambda: opened.append(1))
    assert not opened and not (tmp_path / "o").exists()  # refused by the plan: no folder, no executor
