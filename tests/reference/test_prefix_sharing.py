"""Prefix sharing: one pass per unique token gives the same scores as one independent prefill per plan.

Every stored array (per layer and head segment sums, per-token rows, saved q/k) of the shared run equals
the independent run within 1e-5, on hand-built plan sets with a known structure (identical plans, a
plan that is a prefix of another, branches at a chunk boundary, at token 1 and at the last token,
queries inside the shared prefix, the same tokens under other segments) and on tiny random models with
GQA, sliding windows, soft-capping and attention sinks. The counts are checked against a brute-force
prefix trie.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.sharing import assert_same, branch, brute_trie, random_tokens, token_plan

from attnprobe_hooks.backend import CapturePlan, LoadedModel
from attnprobe_hooks.sharing import schedule, stats
from attnprobe_hooks.transformers.attention import install
from attnprobe_hooks.transformers.backend import run_plans
from attnprobe_hooks.transformers.generate import GenerationCounts, GenerationRequest, capture_and_generate

VOCAB = 40


# ------------------------------------------------------------------ the schedule (no model)
def test_schedule_scores_every_row_once_and_prefills_the_trie():
    rng = np.random.default_rng(1)
    for _ in range(200):
        root = rng.integers(0, 3, size=int(rng.integers(1, 12)))
        seqs = []
        for _ in range(int(rng.integers(1, 7))):  # branches of a small random trie, with repeats and prefixes
            cut = int(rng.integers(0, len(root) + 1))
            seqs.append(np.concatenate([root[:cut], rng.integers(0, 3, size=int(rng.integers(0, 5)))]))
        seqs = [s if len(s) else root[:1] for s in seqs]
        passes = schedule(seqs)
        st = stats(seqs, passes, shared=True)
        assert st.prefilled_tokens == st.trie_tokens == brute_trie(seqs)
        assert st.plan_tokens == sum(len(s) for s in seqs)
        scored = [np.zeros(len(s), int) for s in seqs]
        for ps in passes:
            assert ps.shares[0] == (ps.plan, ps.end)
            for j, limit in ps.shares:
                # the pass's tokens agree with plan j up to its limit, so the rows there are plan j's rows
                np.testing.assert_array_equal(seqs[j][:limit], seqs[ps.plan][:limit])
                scored[j][ps.start:limit] += 1
        for s in scored:
            np.testing.assert_array_equal(s, 1)  # every position of every plan: exactly one pass
        plain = schedule(seqs, share=False)
        assert stats(seqs, plain, shared=False).prefilled_tokens == st.plan_tokens


def test_counts_on_a_hand_built_set():
    a = np.array([1, 2, 3, 4, 5])
    seqs = [a, a.copy(), a[:3], np.array([1, 2, 9, 9]), np.array([7])]
    st = stats(seqs, schedule(seqs), shared=True)
    # trie: 1-2-3-4-5 (5 nodes) + 9-9 under 1-2 (2) + 7 (1)
    assert (st.plan_tokens, st.prefilled_tokens, st.trie_tokens) == (18, 8, 8)
    assert st.reuse_ratio == pytest.approx(18 / 8)
    assert "prefilled 8" in st.line() and "2.25x" in st.line()


# ------------------------------------------------------------------ tiny random models
def _tiny(kind: str) -> LoadedModel:
    from transformers import AutoModelForCausalLM

    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=256)
    impl = "sdpa"
    if kind == "llama":
        from transformers import LlamaConfig as Config
    elif kind == "mistral-window":
        from transformers import MistralConfig as Config
        common["sliding_window"] = 11
    elif kind == "gemma2-softcap":
        from transformers import Gemma2Config as Config
        common.update(sliding_window=9, attn_logit_softcapping=2.0, query_pre_attn_scalar=8)
        impl = "eager"
    elif kind == "gptoss-sinks":
        from transformers import GptOssConfig as Config
        common.update(sliding_window=10, num_local_experts=2, num_experts_per_tok=1,
                      layer_types=["sliding_attention", "full_attention"])
        impl = "eager"
    else:
        raise ValueError(kind)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Config(**common), attn_implementation=impl)
    with torch.no_grad():
        for layer in model.base_model.layers:
            # Random init gives near-uniform rows, under which a wrong key set could still sum right: peaked rows.
            layer.self_attn.q_proj.weight.mul_(20)
            layer.self_attn.k_proj.weight.mul_(20)
            if kind == "gptoss-sinks":  # random init leaves sinks at zero: make them matter
                torch.nn.init.normal_(layer.self_attn.sinks, std=1.0)
    model.eval()
    return LoadedModel(model=model, tokenizer=None, spec=kind, name=kind, backend="transformers", dtype="float32",
                       source="test", attn_implementation=install(model))


KINDS = ("llama", "mistral-window", "gemma2-softcap", "gptoss-sinks")


@pytest.fixture(scope="module", params=KINDS)
def tiny(request):
    return _tiny(request.param)


def _base(n: int, seed: int = 0) -> np.ndarray:
    return random_tokens(n, seed, high=VOCAB)


def _branch(base: np.ndarray, at: int, tail: int, seed: int) -> np.ndarray:
    return branch(base, at, tail, seed, high=VOCAB)


_plan = token_plan


CHUNK = 7


def plan_sets() -> dict[str, list[CapturePlan]]:
    b = _base(40)
    return {
        # same tokens three times: other queries, other segments, other layer selection
        "identical": [_plan(b, [3, 20, 39]), _plan(b, [0, 20, 33], seg_every=3, seg_offset=1),
                      _plan(b, [39], layers=(1,))],
        # the short plan's queries (one on its last token) are scored in the long plan's pass or its own
        "prefix": [_plan(b, [5, 39]), _plan(b[:18], [2, 17]), _plan(b[:18], [17], seg_every=4)],
        "branch_at_chunk_boundary": [_plan(b, [13, 14, 27, 39]), _plan(_branch(b, 2 * CHUNK, 20, 1), [13, 14, 15, 33]),
                                     _plan(_branch(b, 2 * CHUNK + 1, 9, 2), [14, 15, 23])],
        "branch_at_token_1": [_plan(b, [0, 1, 30]), _plan(_branch(b, 1, 30, 3), [0, 1, 30])],
        "branch_at_last_token": [_plan(b, [10, 38, 39]), _plan(_branch(b, 39, 1, 4), [10, 38, 39])],
        # queries only inside the shared prefix, and a plan sorted before the one it shares with
        "queries_in_shared_prefix": [_plan(_branch(b, 25, 15, 5), [1, 8, 24]), _plan(b, [2, 8, 24, 25]),
                                     _plan(_branch(b, 30, 4, 6), [7, 8, 29, 30])],
        "same_tokens_other_labels": [_plan(b, [9, 19, 29, 39], seg_every=2), _plan(b, [9, 19, 29, 39], seg_every=13),
                                     _plan(b, [9, 19, 29, 39], seg_every=40)],
        "qk_saved": [_plan(b, [12, 39], qk=(0, 1)), _plan(_branch(b, 17, 10, 7), [16, 26], qk=(1,)),
                     _plan(b[:30], [29], qk=(0,))],
        "no_common_prefix": [_plan(_branch(b, 0, 12, 8), [11]), _plan(b[:9], [8])],
    }


@pytest.mark.parametrize("case", list(plan_sets()))
def test_shared_equals_independent(tiny, case):
    plans = plan_sets()[case]
    alone = run_plans(tiny, plans, chunk_size=CHUNK, share_prefixes=False)
    shared = run_plans(tiny, plans, chunk_size=CHUNK, share_prefixes=True)
    assert_same(shared, alone, plans)
    ids = [p.input_ids for p in plans]
    assert shared.sharing.prefilled_tokens == brute_trie(ids) == shared.sharing.trie_tokens
    assert alone.sharing.prefilled_tokens == sum(len(i) for i in ids)
    # rows are distributions over the keys up to the query (sinks excepted): nothing lost, nothing twice
    if tiny.spec != "gptoss-sinks":
        for out in shared:
            for arr in out.scorer.per_layer.values():
                np.testing.assert_allclose(arr.sum(-1).numpy(), 1.0, atol=1e-5)


def test_chunk_boundaries_anywhere(tiny):
    """Branch points and queries fall at every offset of the chunk for several chunk sizes."""
    b = _base(33, seed=9)
    plans = [_plan(_branch(b, at, 33 - at, at), sorted({max(0, at - 1), at, 32})) for at in range(1, 33, 4)]
    plans.append(_plan(b, list(range(0, 33, 4))))
    for chunk in (3, 5, 33):
        alone = run_plans(tiny, plans, chunk_size=chunk, share_prefixes=False)
        shared = run_plans(tiny, plans, chunk_size=chunk, share_prefixes=True)
        assert_same(shared, alone, plans)


def test_crop_leaves_no_stale_state(tiny):
    """A run after a run (the model and its attention function are reused), and plans in reverse order,
    give the same numbers: nothing from the previous cache or scorer leaks into the next."""
    plans = plan_sets()["branch_at_chunk_boundary"]
    first = run_plans(tiny, plans, chunk_size=CHUNK)
    again = run_plans(tiny, plans[::-1], chunk_size=CHUNK)[::-1]
    assert_same(first, again, plans)


def test_generation_from_the_captured_cache(tiny):
    """Greedy continuations from the shared cache equal ``generate`` on the prompt alone, and the
    generations leave the cache exactly as the capture needs it (the captures are unchanged)."""
    plans = [*plan_sets()["branch_at_chunk_boundary"], _plan(_base(40), [39], seg_every=7)]
    # inside the shared prefix, past a branch, the whole plan, 1 token; two requests on one plan
    prompts = [(0, 20), (1, 33), (2, plans[2].n), (3, 1), (0, 39)]
    ref = run_plans(tiny, plans, chunk_size=CHUNK)
    outs, new, counts = capture_and_generate(
        tiny, plans, [GenerationRequest(i, n, 5, {"pad_token_id": 0}) for i, n in prompts], chunk_size=CHUNK)
    assert_same(outs, ref, plans)
    for k, (i, n) in enumerate(prompts):
        ids = torch.as_tensor(plans[i].input_ids[:n])[None]
        with torch.no_grad():
            want = tiny.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False,
                                       pad_token_id=0)[0, n:].tolist()
        assert new[k] == want, (i, n)
        assert counts[k] == GenerationCounts(prompt_tokens=n, prefilled_tokens=1, new_tokens=len(want))
    with pytest.raises(ValueError, match="outside"):
        capture_and_generate(tiny, plans, [GenerationRequest(0, 41, 1)], chunk_size=CHUNK)
