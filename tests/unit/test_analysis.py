"""Heatmap, decay curves and headline shares against hand-computed values on a constructed result."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnprobe.render.segments import QueryPoint, Segment
from attnprobe.results import analysis
from attnprobe.results.result import CaptureResult


def synthetic(T=8, seed=0):
    """T turns; turn 0 = system + task + reasoning + observation, later turns reasoning + tool + observation."""
    rng = np.random.default_rng(seed)
    segs, pos = [], 0

    def add(role, author, turn):
        nonlocal pos
        segs.append(Segment(role, author, turn, turn, pos, pos + 3))
        pos += 3

    add("system", "external", 0)
    add("task", "external", 0)
    for t in range(T):
        add("template", "external", t)
        add("reasoning", "self", t)
        add("tool_call", "self", t)
        add("observation", "external", t)
    queries = [QueryPoint(s.start, "reasoning", s.turn, s.message_index) for s in segs if s.role == "reasoning"]
    S = len(segs)
    att = rng.random((len(queries), S))
    for i, q in enumerate(queries):  # causal: nothing after the query's own segment
        att[i, [j for j, s in enumerate(segs) if s.start > q.position]] = 0
        att[i] /= att[i].sum()
    lh = np.repeat(att[:, None, None, :], 2, axis=1).repeat(3, axis=2)
    return CaptureResult("syn", np.zeros(pos, dtype=np.int64), segs, queries, [0, 1], att, lh,
                         np.zeros((len(queries), pos)), meta={"model": "m"})


def test_turn_role_and_heatmap_by_hand():
    res = synthetic()
    seg_att = res.segment_attention
    tr = res.turn_role_attention()
    # Step 5 -> turn 2 reasoning: exactly the one reasoning segment of turn 2.
    j = next(i for i, s in enumerate(res.segments) if s.turn == 2 and s.role == "reasoning")
    assert tr[5, 2, 2] == pytest.approx(seg_att[5, j])
    hm = analysis.heatmap(res)
    assert hm.reasoning[5, 2] == pytest.approx(seg_att[5, j])
    o = next(i for i, s in enumerate(res.segments) if s.turn == 2 and s.role == "observation")
    assert hm.observation[2, 5] == pytest.approx(seg_att[5, o])  # transposed into the upper triangle
    assert np.isnan(np.diag(hm.reasoning)).all() and np.isnan(np.diag(hm.observation)).all()
    assert np.isnan(hm.reasoning[2, 5]) and np.isnan(hm.observation[5, 2])
    off = hm.reasoning[np.isfinite(hm.reasoning)]
    assert hm.reasoning_clim == (0.0, pytest.approx(off.max()))
    # Per-layer/head selection reproduces the mean when all heads are equal.
    np.testing.assert_allclose(res.turn_role_attention(layer=1, head=2), tr)


def test_decay_curves_by_hand():
    res = synthetic(T=8)
    d = analysis.decay_curves([res], bins=20, min_past=5)
    tr = res.turn_role_attention()
    steps = [5, 6, 7]
    assert d["num_steps"] == 3
    # Step 7 has past turns 0..6 at x = j/6: j=6 -> bin 19, j=3 -> bin 10, j=0 -> bin 0.
    # Bin 19 collects the most recent past turn of each step.
    expected_19 = np.mean([tr[t, t - 1, 2] for t in steps])
    assert d["mean"]["reasoning"][19] == pytest.approx(expected_19)
    expected_cum_last = np.mean([tr[t, :t, 4].sum() for t in steps])
    assert d["cumulative"]["observation"][-1] == pytest.approx(expected_cum_last)
    total = np.mean([tr[t, :t, 2:5].sum() for t in steps])
    assert d["cumulative"]["all"][-1] == pytest.approx(total) and total < 1


def test_headline_by_hand():
    res = synthetic(T=12)
    h = analysis.headline([res])
    tr = res.turn_role_attention()
    steps = range(1, 12)
    pr = np.mean([tr[t, :t, 2].sum() for t in steps])
    po = np.mean([tr[t, :t, 4].sum() for t in steps])
    assert h["num_steps"] == 11
    assert h["past_reasoning"] == pytest.approx(pr) and h["past_observation"] == pytest.approx(po)
    assert h["reasoning_vs_observation"] == pytest.approx(pr / (pr + po))
    rec = [tr[t, t - math.ceil(0.1 * t):t, 4].sum() / tr[t, :t, 4].sum() for t in range(5, 12)]
    assert h["recent_observation_share"] == pytest.approx(np.mean(rec)) and h["recent_steps"] == 7


def test_step_breakdown_sums_to_one():
    res = synthetic()
    for row in analysis.step_breakdown(res)["steps"]:
        assert sum(v for k, v in row.items() if k != "turn") == pytest.approx(1.0)
