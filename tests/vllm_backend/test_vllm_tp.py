"""Tensor parallelism (TP=2 on CPU): shards merged by global head index, KV replicas not double counted.

Two small random llamas built here: 8 query heads / 2 KV heads (each rank: 4 heads, 1 KV head)
and 4 query heads / 1 KV head (TP=2 > KVH: the KV head is replicated on both ranks). Both set
``head_dim`` explicitly (32, 64) to a value different from hidden_size // heads (8, 16); vLLM-CPU
attention kernels need head_dim in {32, 64, 80, 96, 112, 128, ...}.
"""

from __future__ import annotations

import numpy as np
import pytest

# a submodule: (kept as a guard: a folder named vllm on sys.path would look like a namespace package)
pytest.importorskip("vllm.sampling_params", reason="the vLLM backend tests need vLLM (run .ci/vllm.sh)")

from support.sharing import BLOCK, assert_same, vllm_plan_sets  # noqa: E402

from attnprobe_hooks.backend import get_backend  # noqa: E402

TOL = 1e-5
QUERIES = "reasoning+decision"


def _compare(folder, shipped, *, heads, kv_heads, head_dim):
    import attnprobe
    from attnprobe.capture.api import capture_many
    from attnprobe_hooks.vllm import backend as vllm_backend

    trajs = shipped[1:3]
    tm = attnprobe.load_model(str(folder), backend="transformers", dtype="float32")
    refs = [attnprobe.capture(tm, t, queries=QUERIES, save_qk_layers=[1]) for t in trajs]
    vm = attnprobe.load_model(str(folder), backend="vllm", dtype="float32", tensor_parallel_size=2, chunk_size=128)
    try:
        assert [r["rank"] for r in vm.ranks] == [0, 1]
        assert all(r["local_heads"] == heads // 2 and r["head_dim"] == head_dim for r in vm.ranks)
        assert [r["head_offset"] for r in vm.ranks] == [0, heads // 2]
        worst = 0.0
        got = [attnprobe.capture(vm, t, queries=QUERIES, save_qk_layers=[1]) for t in trajs]
        batched = capture_many(vm, trajs, queries=QUERIES, share_prefixes=False)  # no prefix cache (the default shares)
        for rv, rb, rt in zip(got, batched, refs):
            assert rv.meta["tensor_parallel_size"] == 2 and rv.meta["head_dim"] == head_dim
            assert rv.layer_head_attention.shape == rt.layer_head_attention.shape
            assert rv.layer_head_attention.shape[2] == heads
            for name in ("layer_head_attention", "segment_attention", "token_attention"):
                d = float(np.abs(getattr(rv, name) - getattr(rt, name)).max())
                db = float(np.abs(getattr(rb, name) - getattr(rt, name)).max())
                assert d <= TOL and db <= TOL, f"{name}: {d:.3g} / batched {db:.3g}"
                worst = max(worst, d, db)
            # every query row is a distribution over all keys: a head counted twice (or dropped) breaks it
            np.testing.assert_allclose(rv.layer_head_attention.sum(axis=-1), 1.0, atol=1e-5)
            np.testing.assert_allclose(rv.token_attention.sum(axis=-1), 1.0, atol=1e-5)
            assert rv.qk["layer1.q"].shape == rt.qk["layer1.q"].shape == (heads, len(rv.input_ids), head_dim)
            assert rv.qk["layer1.k"].shape == rt.qk["layer1.k"].shape == (kv_heads, len(rv.input_ids), head_dim)
            assert float((rv.qk["layer1.k"] - rt.qk["layer1.k"]).abs().max()) < 1e-4
            assert float((rv.qk["layer1.q"] - rt.qk["layer1.q"]).abs().max()) < 1e-4
        print(f"TP=2, {heads} heads / {kv_heads} KV heads: max abs diff vs transformers {worst:.3g}")
        # prefix sharing on every rank: each rank's hooks serve its own cache hits from its own buffers
        sets = vllm_plan_sets()
        for case in ("identical", "branch_on_block_boundaries", "queries_in_shared_prefix"):
            plans = sets[case]
            shared = get_backend("vllm").run(vm, plans, share_prefixes=True)
            ref = get_backend("transformers").run(tm, plans, chunk_size=128, share_prefixes=False)
            d = assert_same(shared, ref, plans, tol=2e-5)
            hits = [o.info["prefix_cache_hit_tokens"] for o in shared]
            assert sum(hits) >= 2 * BLOCK and all(o.info["matched_by"] == "request" for o in shared), (case, hits)
            print(f"TP=2 prefix sharing {case}: hits {hits}, max abs diff {max(d.values()):.3g}")
    finally:
        vllm_backend.unload(vm)


def test_tp2_gqa_8_heads_2_kv(random_llama, shipped):
    folder = random_llama(heads=8, kv_heads=2, head_dim=32, hidden=64)
    _compare(folder, shipped, heads=8, kv_heads=2, head_dim=32)


def test_tp2_exceeds_kv_heads(random_llama, shipped):
    folder = random_llama(heads=4, kv_heads=1, head_dim=64, hidden=64, seed=1)
    _compare(folder, shipped, heads=4, kv_heads=1, head_dim=64)
