"""Capture at the device's speed (issue 36): scores stay on the device and move to the host once, the chunk
is chosen for the device and recorded with its reason, and a chunk that continues a cache runs SDPA with the
lower-right causal bias instead of a [q, kv] mask, with the same numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnprobe
from attnprobe_hooks.chunking import GIB, STEP, ChunkChoice, Shape, choose_for_memory, estimate_bytes
from attnprobe_hooks.scoring import QueryScorer, score_query_rows
from attnprobe_hooks.syncs import count_host_reads

QWEN25_7B = Shape(layers=28, hidden=3584, intermediate=18944, heads=28, kv_heads=4, head_dim=128, dtype_bytes=2,
                  sliding=False)
QWEN3_8B = Shape(layers=36, hidden=4096, intermediate=12288, heads=32, kv_heads=8, head_dim=128, dtype_bytes=2,
                 sliding=False)


@pytest.fixture(scope="module")
def long_traj():
    from attnprobe.resources import data_path

    return attnprobe.load_trajectories(data_path("long_research.jsonl"))[0]


def test_host_reads_do_not_grow_with_layers_or_chunks(tiny_smol, long_traj):
    """The per-layer path reads nothing back: a capture's host reads are the same few whether it scores one
    layer or four, in 13 chunks or 101 (on 12de885 a capture made 13 per layer per chunk: 4,315 for the
    bundled model's 5k-token trajectory)."""
    counts = {}
    for layers, chunk in [([0], 256), (None, 256), (None, 16)]:
        with count_host_reads() as reads:
            res = attnprobe.capture(tiny_smol, long_traj, layers=layers, chunk_size=chunk, max_tokens=1024,
                                    truncate=True)
        counts[(None if layers is None else len(layers), chunk)] = reads.total
        assert res.meta["chunk_size"] == chunk and len(res.queries) > 1
    assert len(res.input_ids) == 1024  # 64 chunks of 16 tokens against 4 of 256
    assert len(set(counts.values())) == 1, counts
    assert counts[(None, 16)] <= 16, counts


def test_host_read_counter_sees_reads():
    """The counter is not blind: each kind of read is counted once, and a library's no-op ``.to(x.device)`` of
    a CPU tensor is not (it would not touch the host on a GPU either)."""
    t = torch.arange(4)
    with count_host_reads() as reads:
        t.sum().item()
        t.tolist()
        t.numpy()
        bool(t[0])
        int(t[1])
        t.nonzero()
    assert dict(reads) == {"item": 1, "tolist": 1, "numpy": 1, "bool": 1, "int": 1, "nonzero": 1}
    assert torch.Tensor.item.__name__ == "item" and not hasattr(torch.Tensor.item, "__wrapped__")  # restored


def test_scorer_keeps_scores_where_they_are_computed_and_moves_them_once():
    """Scores accumulate on the scoring device; to_host brings per-layer scores and token rows back in one
    copy with the same values (here the 'device' is a second CPU dtype path: the values are what matter)."""
    rng = np.random.default_rng(1)
    H, KVH, n, d, S = 4, 2, 30, 8, 3
    q = torch.tensor(rng.normal(size=(H, n, d)), dtype=torch.float32)
    k = torch.tensor(rng.normal(size=(KVH, n, d)), dtype=torch.float32)
    seg = torch.tensor(np.repeat(np.arange(S), n // S))
    qpos = [4, 11, 29]
    scorer = QueryScorer(seg_ids=seg, num_segments=S, query_positions=qpos)
    for layer in (0, 1):
        scorer.score_layer(layer, q[:, :16], k[:, :16], 0, 0, 0.25)  # chunk 0..15: queries 4 and 11
        scorer.score_layer(layer, q[:, 16:], k, 16, 0, 0.25)  # chunk 16..29: query 29 against every key
    with count_host_reads() as reads:
        layers, lh = scorer.layer_head_tensor()
    assert reads.total <= 1  # the one copy (none here: already on the CPU)
    seg_ref, tok_ref = score_query_rows(q[:, qpos], k, qpos, 0, seg, S, 0.25)
    assert layers == [0, 1]
    torch.testing.assert_close(lh[:, 0], seg_ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(scorer.token_sum, 2 * tok_ref, rtol=0, atol=1e-6)
    assert lh[:, 0].sum(-1).numpy() == pytest.approx(np.ones((3, H)), abs=1e-5)


def test_lower_right_chunks_equal_one_pass(tiny_smol, samples):
    """Chunks that continue the cache go through SDPA with torch's lower-right causal bias (no [q, kv] mask);
    the scores equal a one-pass capture and the 64-token chunks' within float rounding."""
    from attnprobe_hooks.transformers import attention as A

    traj = samples["sample-reasoning-1"]
    calls = []
    original = A._lower_right

    def spy(*args, **kwargs):
        calls.append(tuple(args[1].shape))
        return original(*args, **kwargs)

    A._lower_right = spy
    try:
        chunked = attnprobe.capture(tiny_smol, traj, queries="reasoning+decision", chunk_size=64)
    finally:
        A._lower_right = original
    one = attnprobe.capture(tiny_smol, traj, queries="reasoning+decision", chunk_size=100_000)
    n = len(one.input_ids)
    assert one.meta["chunk_size"] == 100_000 and n > 128
    assert len(calls) == (-(-n // 64) - 1) * tiny_smol.num_layers  # every chunk after the first, every layer
    np.testing.assert_allclose(chunked.layer_head_attention, one.layer_head_attention, atol=1e-5)
    np.testing.assert_allclose(chunked.token_attention, one.token_attention, atol=1e-5)


def test_chunk_mask_falls_back_where_the_bias_is_not_exact():
    """Padding, windows, custom mask functions and a static cache (keys past the chunk) keep transformers'
    tensor mask; only a plain causal chunk at the end of its keys gets the bias."""
    from torch.nn.attention.bias import CausalBias
    from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function

    from attnprobe_hooks.transformers.attention import chunk_mask

    bias = chunk_mask(1, 4, 10, 6, 0, mask_function=causal_mask_function)
    assert isinstance(bias, CausalBias) and (bias.seq_len_q, bias.seq_len_kv) == (4, 10)
    dense = chunk_mask(1, 4, 10, 6, 0, mask_function=causal_mask_function, attention_mask=torch.tensor([[0] + [1] * 9]))
    assert isinstance(dense, torch.Tensor) and dense.shape == (1, 1, 4, 10) and not bool(dense[0, 0, 0, 0])
    windowed = chunk_mask(1, 4, 10, 6, 0, mask_function=sliding_window_causal_mask_function(3), local_size=3)
    assert isinstance(windowed, torch.Tensor)
    static = chunk_mask(1, 4, 16, 6, 0, mask_function=causal_mask_function)  # keys 10..15 are empty slots
    assert isinstance(static, torch.Tensor) and static[0, 0].sum(-1).tolist() == [7, 8, 9, 10]
    assert chunk_mask(1, 10, 10, 0, 0, mask_function=causal_mask_function) is None  # one pass: is_causal


def test_one_pass_when_it_fits_else_the_largest_chunk():
    """On a GPU the chunk is the trajectory when its prefill fits the free memory, else the largest multiple
    of 512 that does; the reason says which and with what numbers."""
    free = 120 * GIB  # an H200 holding a 7-8B model in bf16
    one = choose_for_memory(QWEN25_7B, 31_395, 40, free)
    assert one.size == 31_395 and one.reason.startswith("one pass: 31,395 tokens fit")
    big = choose_for_memory(QWEN3_8B, 125_684, 40, free)
    assert big.size == 125_684, big  # 126k tokens of a Qwen3-8B shape: one pass on an H200
    tight = choose_for_memory(QWEN3_8B, 125_684, 40, 40 * GIB)
    assert STEP <= tight.size < 125_684 and tight.size % STEP == 0 and tight.reason.startswith("largest chunk")
    budget = 40 * GIB * 0.9 - GIB
    assert estimate_bytes(QWEN3_8B, 125_684, tight.size, 40) <= budget
    assert estimate_bytes(QWEN3_8B, 125_684, tight.size + STEP, 40) > budget  # the largest: one step more won't fit
    assert choose_for_memory(QWEN3_8B, 125_684, 40, 10 * GIB) == ChunkChoice(
        STEP, choose_for_memory(QWEN3_8B, 125_684, 40, 10 * GIB).reason)
    assert "may run out of memory" in choose_for_memory(QWEN3_8B, 125_684, 40, 10 * GIB).reason


def test_memory_estimate_counts_the_cache_and_one_chunk():
    """The estimate on hand-computed numbers: the KV cache of a Qwen3-8B shape at 100k tokens in bf16 is
    2 x 36 x 8 x 128 x 100k x 2 bytes = 13.7 GiB, and a chunk adds its activations linearly."""
    kv = 2 * 36 * 8 * 128 * 100_000 * 2
    assert kv / GIB == pytest.approx(13.73, abs=0.01)
    small, large = estimate_bytes(QWEN3_8B, 100_000, 1024, 0), estimate_bytes(QWEN3_8B, 100_000, 2048, 0)
    per_token = 2 * (4 * 4096 + 3 * 12288 + 2 * (32 + 16) * 128)
    assert large - small == int(1.25 * 1024 * per_token) or abs(large - small - 1.25 * 1024 * per_token) <= 1
    assert small > kv
    windowed = Shape(**{**QWEN3_8B.__dict__, "sliding": True})
    assert estimate_bytes(windowed, 100_000, 1024, 0) - small == 1024 * 100_000  # the [q, kv] bool mask


def test_cpu_chunk_is_512_and_meta_says_why(tiny_smol, samples):
    res = attnprobe.capture(tiny_smol, samples["sample-reasoning-1"])
    assert res.meta["chunk_size"] == 512 and res.meta["chunk_reason"] == "the default on cpu (512 tokens)"
    given = attnprobe.capture(tiny_smol, samples["sample-reasoning-1"], chunk_size=96)
    assert (given.meta["chunk_size"], given.meta["chunk_reason"]) == (96, "given (--chunk-size)")
