"""vLLM with prefix caching on: a prefix common to several plans of one call is prefilled once, and the
capture stays exact (the hooks take what a cache hit skips from the plan that computed it).

Hand-built plan sets on a small random-weight llama (vLLM-CPU's prefix-cache blocks are 128 tokens;
the prefill chunk, 96, cuts blocks anywhere): each is captured with sharing and without (every plan
its own cache salt) and by the transformers backend: every stored array of the shared capture equals
the unshared one within 1e-5 and the transformers capture within 2e-5 (the bound of the other vLLM
tests: two kernels summing softmax rows in different orders).
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.sampling_params", reason="the vLLM backend tests need vLLM (run .ci/vllm.sh)")

from support.sharing import BLOCK, assert_same, vllm_plan_sets  # noqa: E402

CHUNK = 96


@pytest.fixture(scope="module")
def engines(random_llama):
    import attnprobe
    from attnprobe_hooks.vllm import backend as vllm_backend

    folder = random_llama(heads=8, kv_heads=2, head_dim=32, hidden=64, layers=2)
    vm = attnprobe.load_model(str(folder), backend="vllm", dtype="float32", chunk_size=CHUNK)
    tm = attnprobe.load_model(str(folder), backend="transformers", dtype="float32")
    yield vm, tm
    vllm_backend.unload(vm)


def test_shared_capture_equals_independent_on_every_plan_set(engines):
    from attnprobe_hooks.backend import get_backend

    vm, tm = engines
    vb, tb = get_backend("vllm"), get_backend("transformers")
    hits: dict[str, list[int]] = {}
    worst = {"vs unshared": 0.0, "vs transformers": 0.0}
    for case, plans in vllm_plan_sets().items():
        shared = vb.run(vm, plans, share_prefixes=True)
        alone = vb.run(vm, plans, share_prefixes=False)
        ref = tb.run(tm, plans, chunk_size=CHUNK, share_prefixes=False)
        try:
            d1 = assert_same(shared, alone, plans)
            d2 = assert_same(shared, ref, plans, tol=2e-5)
        except AssertionError as exc:
            raise AssertionError(f"{case}: {exc}") from None
        worst["vs unshared"] = max(worst["vs unshared"], *d1.values())
        worst["vs transformers"] = max(worst["vs transformers"], *d2.values())
        hits[case] = [o.info["prefix_cache_hit_tokens"] for o in shared]
        assert all(o.info["prefix_cache_hit_tokens"] == 0 for o in alone), case
        assert all(o.info["prefilled_tokens"] == p.n for o, p in zip(alone, plans)), case
        for o, p in zip(shared, plans):  # every position is either taken from the cache or prefilled
            assert o.info["matched_by"] == "request", case  # each request bound to its plan by its whole prompt
            assert o.info["prefix_cache_hit_tokens"] + o.info["prefilled_tokens"] == p.n, case
            assert o.info["prefix_cache_hit_tokens"] % BLOCK == 0, case
        st = shared.sharing
        assert st.plan_tokens == sum(p.n for p in plans) and st.trie_tokens <= st.prefilled_tokens <= st.plan_tokens
        assert st.prefilled_tokens == st.plan_tokens - sum(hits[case])
    print("prefix-cache hits per plan:", hits, "max |diff|:", worst)
    # the engine really served prefixes from its cache, up to n - 1 rounded down to a block
    assert sorted(hits["identical"]) == [0, 512, 512]
    assert sorted(hits["prefix"])[1:] == [256, 256] or sorted(hits["prefix"]) == [0, 256, 256]
    assert max(hits["branch_on_block_boundaries"]) == 256 and sum(hits["branch_on_block_boundaries"]) >= 3 * 128
    assert hits["branch_at_last_token"] in ([0, 512], [512, 0])
    assert hits["no_common_prefix"] == [0, 0]
    assert hits["qk_saved_next_to_sharing"][0] == 0 and hits["qk_saved_next_to_sharing"][2] > 0


def test_preempted_requests_stay_exact_with_sharing(random_llama, engines, monkeypatch):
    """A KV cache of ~1.2k tokens for 13 plans of 300-600 tokens: the engine preempts requests and recomputes
    them (from 0 or from a cache hit); the rows already processed are skipped, and a recompute that hits past
    them takes the rest from a donor. Scores equal the transformers capture."""
    import attnprobe
    from attnprobe_hooks.backend import get_backend
    from attnprobe_hooks.vllm import backend as vllm_backend

    _, tm = engines
    folder = random_llama(heads=8, kv_heads=2, head_dim=32, hidden=64, layers=2)
    sets = vllm_plan_sets()
    plans = [*sets["identical"], *sets["branch_on_block_boundaries"], *sets["queries_in_shared_prefix"],
             *sets["prefix"]]
    # 2 layers x (K and V) x 2 KV heads x 32 dims x 4 bytes = 1 KiB per token; vLLM-CPU takes the KV cache
    # size from VLLM_CPU_KVCACHE_SPACE (whole GiB) over kv_cache_memory_bytes, so it is unset for this engine
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    vm = attnprobe.load_model(str(folder), backend="vllm", dtype="float32", chunk_size=512, max_model_len=640,
                              kv_cache_gib=1280 / 2**20, max_num_seqs=8,
                              engine_kwargs={"long_prefill_token_threshold": 64})  # 8 prefills grow side by side
    try:
        shared = get_backend("vllm").run(vm, plans, share_prefixes=True)
    finally:
        vllm_backend.unload(vm)
    ref = get_backend("transformers").run(tm, plans, chunk_size=CHUNK, share_prefixes=False)
    d = assert_same(shared, ref, plans, tol=2e-5)
    restarts = [o.info["preempted_restarts"] for o in shared]
    hits = [o.info["prefix_cache_hit_tokens"] for o in shared]
    print("preemption with sharing: restarts", restarts, "hits", hits, "max |diff|", max(d.values()))
    assert sum(restarts) > 0 and sum(hits) > 0
    for o, p in zip(shared, plans):
        assert o.info["prefix_cache_hit_tokens"] + o.info["prefilled_tokens"] == p.n
