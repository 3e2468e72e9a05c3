"""`capture` of a recorded run's calls: they are captured together, sharing their prefill, and equal
the same calls captured one at a time within 1e-5 (the tiny random-weight SmolLM2: the bundled model's
tokenizer and renders, so the same calls share the same prefixes; support/tiny_model.py)."""

from __future__ import annotations

import logging
import re

import numpy as np

from attnprobe.capture.job import CaptureJob, CaptureOptions, sharing_groups
from attnprobe.execution import LocalExecutor
from attnprobe.resources import data_path
from attnprobe.results.result import CaptureResult
from attnprobe.trajectory.schema import load_trajectories


def test_a_recorded_runs_calls_share_their_prefill_and_equal_one_at_a_time(tiny_smol, tmp_path, caplog):
    smol = tiny_smol
    calls = load_trajectories(data_path("runs/nis_agent_sample.jsonl"))
    groups: dict[str, list] = {}
    for t, g in sharing_groups(calls):
        if g is not None:
            groups.setdefault(g, []).append(t)
    chain = max(groups.values(), key=len)[:4]  # calls that begin alike, in extension order
    assert len(chain) == 4

    def capture(out, share):
        job = CaptureJob(out, chain, CaptureOptions(layers=[0, 2, 3], share_prefixes=share), model=smol.spec,
                         backend=smol.backend, dtype=smol.dtype)
        assert LocalExecutor(lambda: smol, progress=False).run(job) == {"done_before": 0, "done": 4, "failed": 0}
        return {t.id: CaptureResult.load(job.folder(t)) for t in chain}

    with caplog.at_level(logging.INFO, logger="attnprobe.capture.api"):
        shared = capture(tmp_path / "shared", True)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("capture batch:"))
    assert "4 plans" in line, line  # one backend call for the four calls
    planned, prefilled = (int(re.search(w, line).group(1).replace(",", ""))
                          for w in (r"plans, ([\d,]+) tokens", r"prefilled ([\d,]+)"))
    assert prefilled < 0.7 * planned, line  # they share the system prompt, the task and the history
    alone = capture(tmp_path / "alone", False)
    for tid, a in alone.items():
        s = shared[tid]
        assert np.array_equal(s.input_ids, a.input_ids)
        for name in ("segment_attention", "layer_head_attention", "token_attention"):
            np.testing.assert_allclose(getattr(s, name), getattr(a, name), atol=1e-5, err_msg=f"{tid}: {name}")
