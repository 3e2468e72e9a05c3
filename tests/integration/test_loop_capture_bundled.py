"""Capture in the loop on the bundled model (issue 40): a seed002 study with structured actions (so the agent
acts over several turns, each from its episode's kept cache) and batched rollouts, three policies; every call
captured in the loop equals ``study attention``'s post-hoc capture of it within 1e-5, both queries, every layer."""

import pytest

from attnprobe.cli.main import main
from attnprobe.resources import data_path
from tests.support.loop_capture import compare, in_loop_folders, post_hoc_copy

pytestmark = pytest.mark.slow


def test_bundled_study_captured_in_the_loop_equals_study_attention(tmp_path):
    loop = tmp_path / "loop"
    assert main(["study", "interference", str(data_path("questions_loop.jsonl")), "--scaffold", "seed002",
                 "--policy", "none", "--policy", "mask:1", "--policy", "mask-obs:1", "--limit", "2", "--max-turns", "3",
                 "--generation-preset", "cpu", "--structured-actions", "--episodes-per-batch", "6",
                 "--capture-in-loop", "--out", str(loop), "--no-progress", "--bootstrap", "20"]) == 0
    calls = sum(1 for p in loop.glob("*/calls/*.jsonl") for _ in p.open())
    assert calls > 6 and len(in_loop_folders(loop)) == calls  # several turns, every call captured in the loop
    post = post_hoc_copy(loop, tmp_path / "post")
    for d in (loop, post):
        assert main(["study", "attention", str(d), "--no-progress", "--bootstrap", "20"]) == 0
    cmp = compare(loop, post)
    assert cmp["calls"] == calls and cmp["meta_differs"] == []
    assert max(cmp["max_abs_diff"].values()) < 1e-5, cmp
