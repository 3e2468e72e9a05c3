"""Captured attention equals transformers eager attention (float32, same weights) within 1e-5.

The capture code does not depend on the weights, so these run on the tiny random-weight SmolLM2 (the
bundled tokenizer, renders and head layout; 4 layers; support/tiny_model.py), and one short check runs on
the bundled model itself (``slow``). The bundled model's own captures are pinned by
tests/integration/test_baseline.py."""

from __future__ import annotations

import numpy as np
import pytest
from support.eager import eager_hooked_rows, eager_output_attentions, reduce_rows

import attnprobe

TOL = 1e-5


def _check(res, rows):
    """rows: [nq, L, H, n] eager reference rows for res.query_positions (all layers)."""
    ref_lh = reduce_rows(rows[:, res.layers], res.segments)  # [nq, L, H, S]
    np.testing.assert_allclose(res.layer_head_attention, ref_lh, atol=TOL, rtol=0)
    np.testing.assert_allclose(res.segment_attention, ref_lh.mean(axis=(1, 2)), atol=TOL, rtol=0)
    np.testing.assert_allclose(res.token_attention, rows[:, res.layers].mean(axis=(1, 2)), atol=TOL, rtol=0)
    # Rows are probability distributions over keys up to the query position.
    np.testing.assert_allclose(res.segment_attention.sum(axis=1), 1.0, atol=1e-5)


CASES = [("sample-parallel-calls", "hooked"), ("sample-reasoning-1", "output_attentions"),
         ("sample-reasoning-2", "output_attentions")]


@pytest.fixture(scope="module")
def references(tiny_smol, samples):
    """(capture at chunk 512, eager reference rows) per case, computed once for its four chunk tests (the
    reference materialises every layer's attention: the costly part; one test per chunk size keeps each
    under the suite's 20 s on a busy machine, issue 38)."""
    cache = {}

    def get(tid, route):
        if (tid, route) not in cache:
            base = attnprobe.capture(tiny_smol, samples[tid], queries="reasoning+decision", chunk_size=512)
            reference = eager_output_attentions if route == "output_attentions" else eager_hooked_rows
            cache[tid, route] = base, reference(tiny_smol.model, base.input_ids, base.query_positions)
        return cache[tid, route]

    return get


@pytest.mark.parametrize("chunk", ["512", "q", "q+1", "97", "default", "one-pass"])
@pytest.mark.parametrize("tid,route", CASES)
def test_matches_eager(tiny_smol, samples, references, tid, route, chunk):
    """Chunk sizes that put a query on the first token of a chunk (q), on the last (q+1), a ragged one, the
    default (chosen for the device) and one pass."""
    base, rows = references(tid, route)
    if chunk == "512":
        _check(base, rows)
        return
    q = int(base.query_positions[1])
    n = len(base.input_ids)
    # the default chunk (chosen for the device: 512 on this CPU) and a forced one pass (issue 36)
    size = {"q": q, "q+1": q + 1, "97": 97, "default": None, "one-pass": n}[chunk]
    res = attnprobe.capture(tiny_smol, samples[tid], queries="reasoning+decision", chunk_size=size)
    assert q % (size or 512) == 0 or q % (size or 512) == (size or 512) - 1 or chunk in ("97", "default", "one-pass")
    assert res.meta["chunk_size"] == (size or 512)
    _check(res, rows)


@pytest.mark.slow  # the eager reference materialises [9, 6456, 6456] per layer: ~20 s even on the tiny model
def test_long_trajectory_matches_eager(tiny_smol, samples):
    smol = tiny_smol
    traj = samples["sample-long-research"]
    res = attnprobe.capture(smol, traj, queries="reasoning", chunk_size=1024)
    assert len(res.input_ids) > 6000 and len(res.queries) == 23
    rows = eager_hooked_rows(smol.model, res.input_ids, res.query_positions)
    _check(res, rows)
    q = int(res.query_positions[10])
    edge = attnprobe.capture(smol, traj, queries="reasoning", chunk_size=q)  # query 10 opens a chunk
    np.testing.assert_allclose(edge.layer_head_attention, res.layer_head_attention, atol=TOL, rtol=0)


def test_layer_selection_and_positions(tiny_smol, samples):
    smol = tiny_smol
    traj = samples["sample-reasoning-1"]
    full = attnprobe.capture(smol, traj, queries="reasoning")
    sub = attnprobe.capture(smol, traj, queries="reasoning", layers=[0, 2, 3])
    assert sub.layers == [0, 2, 3]
    np.testing.assert_allclose(sub.layer_head_attention, full.layer_head_attention[:, [0, 2, 3]], atol=1e-6)
    np.testing.assert_allclose(sub.segment_attention, full.layer_head_attention[:, [0, 2, 3]].mean(axis=(1, 2)),
                               atol=1e-6)
    positions = [5, int(full.query_positions[2]), len(full.input_ids) - 1]
    pos = attnprobe.capture(smol, traj, queries=positions, chunk_size=64)
    assert pos.query_positions.tolist() == positions
    rows = eager_output_attentions(smol.model, pos.input_ids, positions)
    _check(pos, rows)
    np.testing.assert_allclose(pos.segment_attention[1], full.segment_attention[2], atol=TOL)
    with pytest.raises(ValueError, match="layers 4 do not exist"):
        attnprobe.capture(smol, traj, layers=[4])
    with pytest.raises(ValueError, match="outside the trajectory"):
        attnprobe.capture(smol, traj, queries=[10 ** 6])


def test_saved_qk_recompute_scores(tiny_smol, samples, tmp_path):
    smol = tiny_smol  # the bundled model's head layout: 9 query heads over 3 KV heads of 64 dims
    traj = samples["sample-reasoning-2"]
    res = attnprobe.capture(smol, traj, queries="decision", save_qk_layers=[3], chunk_size=300)
    res.save(tmp_path / "r")
    back = attnprobe.CaptureResult.load(tmp_path / "r")
    qk = back.load_qk(tmp_path / "r")
    q, k = qk["layer3.q"], qk["layer3.k"]  # [H, n, d], [KVH, n, d]
    n = len(res.input_ids)
    assert q.shape == (9, n, 64) and k.shape == (3, n, 64)
    p = int(res.query_positions[0])
    kk = k.repeat_interleave(3, dim=0)[:, : p + 1]
    probs = (q[:, p : p + 1] @ kk.transpose(1, 2) / 8.0).softmax(-1)[:, 0].numpy()  # [H, p+1]
    seg = np.stack([probs[:, s.start:s.end].sum(-1) for s in res.segments], -1)
    np.testing.assert_allclose(seg, res.layer_head_attention[0, 3], atol=TOL)


def test_capture_many_equals_capture(tiny_smol, samples):
    """The backend-neutral batch path gives the very same results as one capture per trajectory."""
    smol = tiny_smol
    trajs = [samples["sample-reasoning-1"], samples["sample-reasoning-2"]]
    many = attnprobe.capture_many(smol, trajs, queries="reasoning+decision", layers=[0, 3], batch_size=1)
    assert [r.trajectory_id for r in many] == [t.id for t in trajs]
    for traj, got in zip(trajs, many):
        one = attnprobe.capture(smol, traj, queries="reasoning+decision", layers=[0, 3])
        for name in ("input_ids", "query_positions", "layer_head_attention", "segment_attention", "token_attention"):
            np.testing.assert_array_equal(getattr(got, name), getattr(one, name))
        assert got.layers == one.layers == [0, 3]
        volatile = {"capture_seconds"}
        assert {k: v for k, v in got.meta.items() if k not in volatile} == \
            {k: v for k, v in one.meta.items() if k not in volatile}
        assert got.meta["chunk_size"] == 512 and got.meta["backend"] == "transformers"


@pytest.mark.slow  # one exactness check on the bundled model's own weights (30 layers, 1.6k tokens)
def test_bundled_model_matches_eager(smol, samples):
    traj = samples["sample-reasoning-1"]
    res = attnprobe.capture(smol, traj, queries="reasoning+decision", chunk_size=97)  # ragged chunks
    assert smol.num_layers == 30
    _check(res, eager_hooked_rows(smol.model, res.input_ids, res.query_positions))
