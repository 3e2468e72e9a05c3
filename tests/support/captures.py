"""Hand-built capture results with known numbers (no model): for report and app tests."""

from __future__ import annotations

import numpy as np

from attnprobe.render.segments import QueryPoint, Segment
from attnprobe.results.result import CaptureResult


def synthetic(tid: str, dtype: str = "float32", **meta) -> CaptureResult:
    """Two reasoning steps over five segments; step 2 gives 0.3 to turn 1's reasoning, 0.4 to its observation."""
    segs = [Segment("system", "external", 0, 0, 0, 4), Segment("task", "external", 0, 1, 4, 8),
            Segment("reasoning", "self", 1, 2, 8, 12), Segment("observation", "external", 1, 3, 12, 16),
            Segment("reasoning", "self", 2, 4, 16, 20)]
    queries = [QueryPoint(8, "reasoning", 1, 2), QueryPoint(16, "reasoning", 2, 4)]
    seg_att = np.array([[0.5, 0.5, 0, 0, 0], [0.1, 0.2, 0.3, 0.4, 0]], dtype=np.float32)
    lh = np.repeat(np.repeat(seg_att[:, None, None, :], 2, 1), 3, 2)
    return CaptureResult(tid, np.arange(20), segs, queries, [0, 1], seg_att, lh, np.zeros((2, 20), np.float32),
                         meta={"model": "M", "dtype": dtype, "backend": "transformers",
                               "weights_hash": "abcdef0123456789", **meta},
                         text="ab" * 20, offsets=np.array([[2 * i, 2 * i + 2] for i in range(20)]))


def long_synthetic(tid: str, turns: int = 7, **meta) -> CaptureResult:
    """System and task, then ``turns`` turns of reasoning (4 tokens) + observation (4 tokens); one query
    at the last reasoning start attends uniformly to every earlier token, so every overall share is
    finite and known: past reasoning = past observations = 4 (turns - 1) / position."""
    segs = [Segment("system", "external", 0, 0, 0, 4), Segment("task", "external", 0, 1, 4, 8)]
    for t in range(1, turns + 1):
        start = 8 * t
        segs += [Segment("reasoning", "self", t, 2 * t, start, start + 4),
                 Segment("observation", "external", t, 2 * t + 1, start + 4, start + 8)]
    n = segs[-1].end
    pos = segs[-2].start  # the last reasoning start
    row = np.zeros(n, np.float32)
    row[:pos] = 1.0 / pos
    seg_att = np.array([[row[s.start:s.end].sum() for s in segs]], np.float32)
    lh = np.repeat(np.repeat(seg_att[:, None, None, :], 2, 1), 3, 2)
    return CaptureResult(tid, np.arange(n), segs, [QueryPoint(pos, "reasoning", turns, 2 * turns)], [0, 1], seg_att,
                         lh, row[None, :], meta={"model": "M", "dtype": "float32", "backend": "transformers",
                                                 "weights_hash": "abcdef0123456789", **meta},
                         text="ab" * n, offsets=np.array([[2 * i, 2 * i + 2] for i in range(n)]))
