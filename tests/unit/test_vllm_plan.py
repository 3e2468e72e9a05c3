"""The vLLM backend's pure parts, without an engine (vLLM is not installed in the main venv).

Hand-built flat engine steps (rows of several requests back to back, split by ``query_start_loc``)
are matched to capture plans: two requests sharing steps across chunk boundaries, a request that is
not ours, a preempted request recomputed from position 0, identical prompts, missing token ids,
requests bound to plans by their engine ids. Then one plan's per-layer work (key buffer, scoring at a
tensor-parallel head offset, zero layers), the scorer methods the driver uses to merge shards, and
prefix-cache hits served by a donor plan (equal to the plan processed alone).
"""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
import torch

from attnprobe_hooks.scoring import QueryScorer
from attnprobe_hooks.vllm.layers import LayerInfo, describe_attention, layer_index
from attnprobe_hooks.vllm.plan import (
    Plan,
    StepSlice,
    arm_sharing,
    donor_order,
    match_step,
    query_start_loc,
    step_arrays,
)


def make_plan(tag: str, ids, queries, *, segs=None, num_segments: int = 2, layers=None, qk_layers=()) -> Plan:
    ids = list(ids)
    segs = segs if segs is not None else [0 if i < len(ids) // 2 else 1 for i in range(len(ids))]
    return Plan.from_wire({"tag": tag, "input_ids": ids, "seg_ids": segs, "num_segments": num_segments,
                           "query_positions": list(queries), "layers": layers, "qk_layers": list(qk_layers)})


A_IDS = [100, 101, 102, 103, 104, 105, 106, 107, 108, 109]  # 10 tokens
B_IDS = [200, 201, 202, 203, 204, 205, 206]  # 7 tokens


def step(*pieces):
    """pieces: (ids, start) per request -> (query_start_loc, flat positions, flat ids)."""
    qsl, pos, ids = [0], [], []
    for tokens, start in pieces:
        ids += list(tokens)
        pos += list(range(start, start + len(tokens)))
        qsl.append(len(ids))
    return qsl, np.asarray(pos, dtype=np.int64), np.asarray(ids, dtype=np.int64)


def summary(mapped):
    return [(sl.plan.tag, sl.s, sl.e, sl.start) for sl in mapped]


def test_two_requests_across_chunk_boundaries():
    a, b = make_plan("a", A_IDS, [9]), make_plan("b", B_IDS, [3, 6])
    plans = {"a": a, "b": b}
    # step 1: a[0:4] then b[0:4]; step 2: b[4:7] then a[4:9]; step 3: a[9:10] alone
    got1 = match_step(plans, *step((A_IDS[0:4], 0), (B_IDS[0:4], 0)))
    assert summary(got1) == [("a", 0, 4, 0), ("b", 4, 8, 0)]
    assert (a.next_start, b.next_start) == (4, 4)
    got2 = match_step(plans, *step((B_IDS[4:7], 4), (A_IDS[4:9], 4)))
    assert summary(got2) == [("b", 0, 3, 4), ("a", 3, 8, 4)]
    assert (a.next_start, b.next_start) == (9, 7)
    got3 = match_step(plans, *step((A_IDS[9:10], 9)))
    assert summary(got3) == [("a", 0, 1, 9)]
    assert (a.next_start, a.steps, a.shared_steps, a.restarts) == (10, 3, 2, 0)
    assert (b.next_start, b.steps, b.shared_steps, b.restarts) == (7, 2, 2, 0)
    assert isinstance(got3[0], StepSlice) and got3[0].plan is a


def test_request_that_is_not_ours_is_ignored_but_makes_the_step_shared():
    a = make_plan("a", A_IDS, [5])
    plans = {"a": a}
    foreign = [7, 7, 7]
    got = match_step(plans, *step((foreign, 0), (A_IDS[0:5], 0), ([1, 2], 30)))
    assert summary(got) == [("a", 3, 8, 0)]
    assert (a.next_start, a.steps, a.shared_steps) == (5, 1, 1)
    # a foreign request whose tokens equal ours but at a position we do not expect: not ours either
    got = match_step(plans, *step((A_IDS[2:4], 2)))
    assert got == [] and (a.next_start, a.steps) == (5, 1)
    # a slice running past the end of the prompt cannot be ours
    assert match_step(plans, *step((A_IDS[5:10] + [0], 5))) == []
    assert a.next_start == 5


def test_preempted_request_recomputed_from_zero_skips_the_rows_it_already_processed():
    a, b = make_plan("a", A_IDS, [2, 8]), make_plan("b", B_IDS, [6])
    plans = {"a": a, "b": b}
    match_step(plans, *step((A_IDS[0:6], 0), (B_IDS[0:2], 0)))
    assert (a.next_start, a.seen, b.next_start) == (6, 6, 2)
    # the engine preempted a and recomputes it from 0 (b continues): rows 0..5 are identical, so
    # they are not processed again (the scores they gave stay, counted once)
    got = match_step(plans, *step((B_IDS[2:5], 2), (A_IDS[0:4], 0)))
    assert summary(got) == [("b", 0, 3, 2)]
    assert (a.next_start, a.seen, a.steps, a.restarts, a.prefilled) == (4, 6, 2, 1, 6)
    got = match_step(plans, *step((A_IDS[4:8], 4)))  # only rows 6, 7 are new
    assert summary(got) == [("a", 2, 4, 6)]
    assert (a.next_start, a.seen, a.restarts, a.prefilled) == (8, 8, 1, 8)
    match_step(plans, *step((A_IDS[8:10], 8)))
    assert (a.next_start, a.seen, a.steps, a.restarts, a.shared_steps) == (10, 10, 4, 1, 2)


def test_identical_prompts_go_to_distinct_plans_in_order():
    a, b = make_plan("a", A_IDS, [9]), make_plan("b", A_IDS, [9])
    plans = {"a": a, "b": b}
    got = match_step(plans, *step((A_IDS[0:3], 0), (A_IDS[0:5], 0)))
    assert summary(got) == [("a", 0, 3, 0), ("b", 3, 8, 0)]
    # each continues where it stopped: the start position tells them apart
    got = match_step(plans, *step((A_IDS[5:10], 5), (A_IDS[3:10], 3)))
    assert summary(got) == [("b", 0, 5, 5), ("a", 5, 12, 3)]
    assert (a.next_start, b.next_start, a.restarts, b.restarts) == (10, 10, 0, 0)


def test_a_fresh_plan_is_preferred_over_restarting_an_advanced_one():
    a, b = make_plan("a", A_IDS, [9]), make_plan("b", A_IDS, [9])
    plans = {"a": a, "b": b}
    match_step(plans, *step((A_IDS[0:4], 0)))
    assert (a.next_start, b.next_start) == (4, 0)
    got = match_step(plans, *step((A_IDS[0:4], 0)))  # b's first chunk, not a restart of a
    assert summary(got) == [("b", 0, 4, 0)] and a.restarts == 0


def test_empty_slices_and_missing_token_ids():
    a = make_plan("a", A_IDS, [9])
    qsl, pos, ids = step((A_IDS[0:4], 0))
    got = match_step({"a": a}, [0, 0, 4, 4], pos, None)  # empty slices skipped; no ids: position only
    assert summary(got) == [("a", 0, 4, 0)] and a.shared_steps == 0
    b = make_plan("b", B_IDS, [6])
    with pytest.raises(RuntimeError, match="no input_ids"):
        match_step({"a": a, "b": b}, qsl, pos, None)


def test_step_arrays_and_query_start_loc():
    ids, pos = step_arrays(torch.tensor([5, 6, 7, 0]), torch.tensor([3, 4, 0, 0]), 3)
    assert ids.tolist() == [5, 6, 7] and pos.tolist() == [3, 4, 0]
    mrope = torch.tensor([[10, 11, 12], [0, 0, 0], [1, 1, 1]])  # [3, tokens]: row 0 is the text position
    ids, pos = step_arrays(None, mrope, 2)
    assert ids is None and pos.tolist() == [10, 11]

    class Md:
        query_start_loc = torch.tensor([0, 3, 8])

    assert query_start_loc(Md()) == [0, 3, 8]

    class Buf:
        cpu = torch.tensor([0, 2, 5, 9, 9])

    class Batch:
        num_reqs = 2

    class Runner:
        query_start_loc = Buf()
        input_batch = Batch()

    assert query_start_loc(object(), Runner()) == [0, 2, 5]
    assert query_start_loc(object(), None) is None


def test_layer_index_and_describe_attention_under_tp():
    assert layer_index("model.layers.7.self_attn.attn") == 7
    assert layer_index("decoder.3.attn") == 3
    with pytest.raises(RuntimeError):
        layer_index("model.attn")

    class Impl:
        scale = 0.125
        logits_soft_cap = None
        sinks = None

    class Attn:  # rank 1 of 2: 4 of 8 query heads, 1 of 2 KV heads
        num_heads, num_kv_heads, head_size = 4, 1, 32
        impl = Impl()
        sliding_window = None

    info = describe_attention("model.layers.5.self_attn.attn", Attn(), rank=1, tp=2, total_kv_heads=2)
    assert (info.layer, info.head_offset, info.kv_head_offset, info.total_heads, info.total_kv_heads) == (5, 4, 1, 8, 2)
    assert info.kv_replica_first and info.scale == 0.125 and info.sliding_window is None

    class Replicated(Attn):  # tp=2 > 1 KV head: the KV head is replicated, rank 1 holds the second copy
        num_heads, num_kv_heads, head_size = 2, 1, 64

    info = describe_attention("model.layers.0.self_attn.attn", Replicated(), rank=1, tp=2, total_kv_heads=1)
    assert (info.head_offset, info.kv_head_offset, info.total_heads, info.kv_replica_first) == (2, 0, 4, False)


def _info(layer=0, *, heads=2, kv_heads=1, d=4, head_offset=0, total_heads=None) -> LayerInfo:
    return LayerInfo(name=f"model.layers.{layer}.self_attn.attn", layer=layer, num_heads=heads, num_kv_heads=kv_heads,
                     head_dim=d, scale=1.0 / math.sqrt(d), head_offset=head_offset, kv_head_offset=0,
                     total_heads=total_heads or heads, total_kv_heads=kv_heads, kv_replica_first=True)


def _naive(q, k, qpos, segs, num_segments, scale):
    """[nq, H, S] by hand: q [n, H, d], k [n, KVH, d]."""
    heads, kv = q.shape[1], k.shape[1]
    out = np.zeros((len(qpos), heads, num_segments))
    for i, p in enumerate(qpos):
        for h in range(heads):
            logits = (k[: p + 1, h // (heads // kv)] @ q[p, h]) * scale
            w = np.exp(logits - logits.max())
            w /= w.sum()
            for t in range(p + 1):
                out[i, h, segs[t]] += w[t]
    return out


def test_observe_layer_buffers_keys_scores_rows_and_places_the_shard():
    torch.manual_seed(0)
    n, heads, d = 10, 2, 4
    q = torch.randn(n, heads, d)
    k = torch.randn(n, 1, d)
    segs = [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    plan = make_plan("a", A_IDS, [2, 6], segs=segs, num_segments=3, qk_layers=[0])
    # this rank holds query heads 2..3 of 4
    info = _info(0, heads=heads, head_offset=2, total_heads=4)
    assert plan.n_keys == 7
    for s, e in ((0, 4), (4, 8), (8, 10)):  # chunk boundaries; the last chunk has no query and no keys needed
        plan.observe_layer(info, q[s:e].reshape(e - s, -1), k[s:e].reshape(e - s, -1), s)
    assert plan.calls == 3
    torch.testing.assert_close(plan.keys[0], k[:7].transpose(0, 1), rtol=0, atol=0)  # exact copy, only 7 keys
    lh = plan.scorer.per_layer[0]
    assert lh.shape == (2, 4, 3)
    assert float(lh[:, :2].abs().sum()) == 0.0  # other rank's heads untouched
    ref = _naive(q.double().numpy(), k.double().numpy(), [2, 6], segs, 3, info.scale)
    np.testing.assert_allclose(lh[:, 2:].numpy(), ref, atol=1e-6, rtol=0)
    np.testing.assert_allclose(plan.scorer.token_sum.sum(-1).numpy(), [2.0, 2.0], atol=1e-6)  # 2 heads
    assert float(plan.scorer.token_sum[0, 3:].abs().sum()) == 0.0  # row of query 2 never sees later keys
    assert [t.shape for t in plan.saved_q[0]] == [(2, 4, 4), (2, 4, 4), (2, 2, 4)]
    assert [t.shape for t in plan.saved_k[0]] == [(1, 4, 4), (1, 4, 4), (1, 2, 4)]


def test_observe_layer_zero_layer_shared_kv_and_unwanted_layer():
    torch.manual_seed(1)
    q, k = torch.randn(10, 2, 4), torch.randn(10, 1, 4)
    plan = make_plan("a", A_IDS, [8], layers=[0, 1])
    plan.observe_layer(_info(0), q[:4].reshape(4, -1), k[:4].reshape(4, -1), 0)  # no query in 0..3
    assert plan.scorer.per_layer[0].shape == (1, 2, 2) and float(plan.scorer.per_layer[0].abs().sum()) == 0.0
    plan.observe_layer(_info(2), q[:4].reshape(4, -1), k[:4].reshape(4, -1), 0)  # layer 2 not requested
    assert 2 not in plan.scorer.per_layer and plan.calls == 1
    # layer 1 shares layer 0's KV cache (key=None): it reads layer 0's buffer
    plan.observe_layer(_info(0), q[4:10].reshape(6, -1), k[4:10].reshape(6, -1), 4)
    plan.observe_layer(_info(1), q[4:10].reshape(6, -1), None, 4, shared_keys_layer=0)
    torch.testing.assert_close(plan.scorer.per_layer[1], plan.scorer.per_layer[0], rtol=0, atol=0)
    assert 1 not in plan.keys and plan.calls == 3
    assert plan.report() == {"tokens_seen": 0, "n": 10, "prefix_cache_hit": 0, "prefilled": 0, "request_bound": False,
                             "steps": 0, "shared_steps": 0, "calls": 3, "restarts": 0, "hook_seconds": 0.0}


def test_scorer_shard_merge_methods():
    s = QueryScorer(seg_ids=[0, 0, 1], num_segments=2, query_positions=[1, 2])
    s.place_heads(3, torch.full((2, 2, 2), 0.5), 2, 4)
    s.place_heads(3, torch.full((2, 2, 2), 0.25), 0, 4)
    s.add_token_sum(torch.ones(2, 3))
    s.add_token_sum(torch.ones(2, 3))
    s.check_coverage()
    assert s.per_layer[3][:, :, 0].tolist() == [[0.25, 0.25, 0.5, 0.5]] * 2
    assert s.head_shard(3, 2, 2).tolist() == [[[0.5, 0.5]] * 2] * 2
    assert s.token_sum.tolist() == [[2.0] * 3] * 2
    s.place_heads(3, torch.zeros(2, 1, 2), 1, 4)  # head 1 twice
    with pytest.raises(RuntimeError, match=r"layer 3: heads were scored \[1, 2, 1, 1\] times"):
        s.check_coverage()
    f = s.fresh()
    assert f.per_layer == {} and f.token_sum.tolist() == [[0.0] * 3] * 2 and f.layers is None


def test_extension_import_string_and_no_vllm_needed():
    from attnprobe_hooks.vllm.extension import EXTENSION, AttnprobeWorkerExtension

    module, _, cls = EXTENSION.rpartition(".")
    assert getattr(importlib.import_module(module), cls) is AttnprobeWorkerExtension


def test_registry():
    from attnprobe_hooks.backend import CaptureBackend, applicable_options, backend_names, get_backend, register

    assert {"transformers", "vllm"} <= set(backend_names())
    tb = get_backend("transformers")
    assert tb.name == "transformers" and isinstance(tb, CaptureBackend) and get_backend("transformers") is tb
    assert get_backend("vllm").name == "vllm"  # importing the backend module does not import vLLM
    cli = {"device": "cpu", "tensor_parallel_size": 2, "chunk_size": 256}
    assert applicable_options("transformers", cli) == {"device": "cpu"}
    assert applicable_options("vllm", cli) == {"tensor_parallel_size": 2, "chunk_size": 256}
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        get_backend("nope")
    with pytest.raises(ValueError, match="module:ClassName"):
        register("x", "no_colon")


# ---------------------------------------------------------------------------------------- prefix-cache hits
HEADS, KVH, D = 2, 1, 4


def _rows(ids, p):
    """q [H, d] and k [KVH, d] at position p as a function of tokens 0..p only (what causal attention
    guarantees), so two plans with the same prefix get the same rows there and differ after."""
    g = torch.Generator().manual_seed(hash(tuple(int(x) for x in ids[: p + 1])) % (2**31))
    return torch.randn(HEADS, D, generator=g), torch.randn(KVH, D, generator=g)


def _feed(plans, steps, layers=(0, 1), **kw):
    """Run engine steps (each a list of (plan tag, start, end)) through match_step and the per-layer work in
    donor order, as the worker's hooks do; layer 1 shares layer 0's keys (KV sharing) when kw says so."""
    shared_kv = kw.get("shared_kv", False)
    for pieces in steps:
        qsl, pos, ids, q, k = [0], [], [], [], []
        for tag, s, e in pieces:
            toks = plans[tag].input_ids
            for p in range(s, e):
                qr, kr = _rows(toks, p)
                q.append(qr.reshape(-1))
                k.append(kr.reshape(-1))
            ids += list(toks[s:e])
            pos += list(range(s, e))
            qsl.append(len(ids))
        rids = [tag for tag, _, _ in pieces] if kw.get("bound") is not None else None
        mapped = match_step(plans, qsl, np.asarray(pos), np.asarray(ids), req_ids=rids,
                            prompt_of=(lambda r: plans[r].input_ids) if rids else None, bound=kw.get("bound"))
        qf, kf = torch.stack(q), torch.stack(k)
        for layer in layers:
            info = _info(layer, heads=HEADS, kv_heads=KVH, d=D)
            key = None if (shared_kv and layer == 1) else kf
            for sl in donor_order(mapped, layer):
                sl.plan.observe_layer(info, qf[sl.s:sl.e], None if key is None else key[sl.s:sl.e], sl.start,
                                      donor=sl.donor, donor_from=sl.donor_from,
                                      shared_keys_layer=0 if key is None else None)
    return plans


def _alone(plan_args):
    """The same plan captured alone in one slice (no hit)."""
    tag, ids, queries, kw = plan_args
    plans = {tag: make_plan(tag, ids, queries, **kw)}
    return _feed(plans, [[(tag, 0, len(ids))]])[tag]


def _assert_equal_alone(plan, plan_args):
    ref = _alone(plan_args)
    for layer, arr in ref.scorer.per_layer.items():
        torch.testing.assert_close(plan.scorer.per_layer[layer], arr, rtol=0, atol=1e-6)
    torch.testing.assert_close(plan.scorer.token_sum, ref.scorer.token_sum, rtol=0, atol=1e-6)


BASE = list(range(300, 316))  # 16 tokens


def _sharing_plans(specs):
    plans = {tag: make_plan(tag, ids, queries, **kw) for tag, ids, queries, kw in specs}
    for p in plans.values():
        p.share_group = "g"
    arm_sharing(list(plans.values()))
    return plans


def test_arm_sharing_sizes_key_buffers_and_kept_rows_from_the_longest_common_prefix():
    specs = [("a", BASE, [3, 15], {}), ("b", BASE[:10] + [1, 2, 3], [2, 12], {}), ("c", [9] * 5, [4], {}),
             ("d", BASE[:4] + [8] * 4, [2, 6], {})]
    plans = _sharing_plans(specs)
    a, b, c, d = plans["a"], plans["b"], plans["c"], plans["d"]
    # a and b share 10 tokens, d shares 4 with both, c nothing: keys up to the longest shared prefix
    assert (a.n_keys, b.n_keys, c.n_keys, d.n_keys) == (16, 13, 5, 7)
    # a row is kept where a peer sharing more than its position queries it (a: b's 2 and d's 2; b: a's 3
    # and d's 2; d: a's 3 and b's 2); b's 12 and d's 6 lie beyond every shared prefix
    assert a.share_qpos.tolist() == [2] and b.share_qpos.tolist() == [2, 3] and d.share_qpos.tolist() == [2, 3]
    assert c.share_qpos.tolist() == []
    assert [p.tag for p in a.peers] == ["b", "c", "d"]
    lone = make_plan("d", BASE, [3])  # no share group: untouched
    arm_sharing([lone])
    assert lone.n_keys == 4 and lone.peers == [] and lone.share_qpos.tolist() == []


@pytest.mark.parametrize("shared_kv", [False, True])
def test_a_prefix_cache_hit_equals_the_plan_processed_alone(shared_kv):
    specs = [("a", BASE, [1, 7, 15], {}), ("b", BASE[:12] + [7, 7, 7, 7], [0, 5, 7, 8, 11, 14], {"segs": [i // 3 for i in range(16)], "num_segments": 6}),
             ("c", BASE, [2, 8, 9], {"segs": [int(i > 4) for i in range(16)]})]
    plans = _sharing_plans(specs)
    # a prefills alone in two chunks; then b hits 8 cached tokens and c hits 12 (a block of 4)
    _feed(plans, [[("a", 0, 6)], [("a", 6, 16)], [("b", 8, 16), ("c", 12, 16)]], shared_kv=shared_kv)
    a, b, c = plans["a"], plans["b"], plans["c"]
    assert (b.hit, b.prefilled, c.hit, c.prefilled, a.hit) == (8, 8, 12, 4, 0)
    for p, spec in zip((a, b, c), specs):
        assert p.seen == p.n
        _assert_equal_alone(p, spec)
    torch.testing.assert_close(b.keys[0][:, :8], a.keys[0][:, :8], rtol=0, atol=0)


def test_hits_in_the_same_step_are_served_donors_first_and_chain():
    specs = [("a", BASE, [3, 15], {}), ("b", BASE[:14] + [1, 1], [3, 9, 13, 15], {}),
             ("c", BASE[:15] + [2], [3, 13, 14, 15], {})]
    plans = _sharing_plans(specs)
    # one step: c (hit 12, listed first) can only be served by b (hit 8, which computes 8..15) or a
    # (computing 4..15 this step); a first chunk 0..4 the step before
    mapped = match_step(plans, *step((BASE[:4], 0)))
    assert summary(mapped) == [("a", 0, 4, 0)]
    for layer in (0, 1):
        info = _info(layer, heads=HEADS, kv_heads=KVH, d=D)
        q = torch.stack([_rows(BASE, p)[0].reshape(-1) for p in range(4)])
        k = torch.stack([_rows(BASE, p)[1].reshape(-1) for p in range(4)])
        for sl in donor_order(mapped, layer):
            sl.plan.observe_layer(info, q, k, 0)
    _feed(plans, [[("c", 12, 16), ("b", 8, 16), ("a", 4, 16)]])
    a, b, c = plans["a"], plans["b"], plans["c"]
    assert (b.hit, c.hit) == (8, 12)
    for p, spec in zip((a, b, c), specs):
        _assert_equal_alone(p, spec)


def test_donor_order_serves_each_donor_first_and_refuses_a_cycle():
    plans = _sharing_plans([("a", BASE, [15], {}), ("b", BASE, [15], {})])
    a, b = plans["a"], plans["b"]
    first = StepSlice(b, 0, 4, 12, donor=a)
    second = StepSlice(a, 4, 20, 0)
    order = donor_order([first, second], 0)
    assert next(order) is second  # b waits for its donor
    a.done[0] = 16
    assert next(order) is first
    with pytest.raises(RuntimeError, match="no donor is ready"):
        list(donor_order([StepSlice(a, 0, 4, 12, donor=b), StepSlice(b, 4, 8, 12, donor=a)], 1))


def test_a_hit_no_plan_computed_is_refused_and_a_gap_is_an_error():
    plans = _sharing_plans([("a", BASE, [15], {}), ("b", BASE[:10] + [5] * 6, [15], {})])
    with pytest.raises(RuntimeError, match="no plan of this call computed"):
        match_step(plans, *step((BASE[8:16], 8)))  # a's tokens from 8 on, but nobody computed 0..7
    lone = {"x": make_plan("x", A_IDS, [9])}  # not in a share group: a slice that starts late is not a hit
    match_step(lone, *step((A_IDS[0:4], 0)))
    assert match_step(lone, *step((A_IDS[6:8], 6))) == []  # (matched by tokens: no plan expects 6)
    bound: dict = {}
    match_step(lone, *step((A_IDS[0:4], 0)), req_ids=["r"], prompt_of=lambda r: A_IDS, bound=bound)
    with pytest.raises(RuntimeError, match="skipped positions 4..5"):
        match_step(lone, *step((A_IDS[6:8], 6)), req_ids=["r"], prompt_of=lambda r: A_IDS, bound=bound)


def test_requests_are_bound_to_plans_by_their_whole_prompt():
    # two prompts with the same tokens at 4..7 but different beginnings, and a request that is not ours
    x_ids, y_ids = [1, 2, 3, 4, 50, 51, 52, 53], [9, 9, 9, 9, 50, 51, 52, 53]
    plans = {"x": make_plan("x", x_ids, [7]), "y": make_plan("y", y_ids, [7])}
    prompts = {"r1": y_ids, "r2": x_ids, "r3": [7, 7]}
    bound: dict = {}
    got = match_step(plans, *step((y_ids[0:4], 0), (x_ids[0:4], 0), ([7, 7], 0)), req_ids=["r1", "r2", "r3"],
                     prompt_of=prompts.get, bound=bound)
    assert summary(got) == [("y", 0, 4, 0), ("x", 4, 8, 0)] and bound == {"r1": "y", "r2": "x", "r3": None}
    # the second chunks are identical, in the opposite order: the request ids still tell them apart
    got = match_step(plans, *step((x_ids[4:8], 4), (y_ids[4:8], 4)), req_ids=["r2", "r1"], prompt_of=prompts.get,
                     bound=bound)
    assert summary(got) == [("x", 0, 4, 4), ("y", 4, 8, 4)]
    assert plans["x"].request == "r2" and plans["x"].report()["request_bound"] is True
    with pytest.raises(RuntimeError, match="differ from its prompt"):
        match_step(plans, *step(([0, 0], 0),), req_ids=["r1"], prompt_of=prompts.get, bound=bound)


def test_a_recompute_that_hits_past_what_was_processed_takes_the_rest_from_a_donor():
    specs = [("a", BASE, [2, 6, 10, 15], {}), ("b", BASE[:14] + [4, 4], [1, 5, 9, 11, 14, 15], {})]
    plans = _sharing_plans(specs)
    # b computes 0..6 alone, is preempted; a prefills 0..16; b is recomputed from a hit at 12 (a's blocks):
    # positions 6..11 (its queries 9 and 11 among them) come from a, 12..15 b computes
    _feed(plans, [[("b", 0, 6)], [("a", 0, 16)], [("b", 12, 16)]], bound={})
    b = plans["b"]
    assert (b.hit, b.prefilled, b.restarts, b.seen) == (6, 10, 1, 16)
    _assert_equal_alone(b, specs[1])


def test_a_recompute_from_a_partial_hit_keeps_every_row_once():
    specs = [("a", BASE, [2, 6, 10, 15], {}), ("b", BASE[:12] + [4, 4, 4, 4], [2, 10, 13], {})]
    plans = _sharing_plans(specs)
    bound: dict = {}
    # a then b (hit 8); b preempted after 8..12 and recomputed from a hit at 4; then finished
    _feed(plans, [[("a", 0, 16)], [("b", 8, 12)], [("b", 4, 10)], [("b", 10, 16)]], bound=bound)
    b = plans["b"]
    assert (b.hit, b.restarts, b.seen, b.prefilled) == (8, 1, 16, 8)
    _assert_equal_alone(b, specs[1])
