"""Capture while vLLM generates, the pure parts (attnprobe_hooks.vllm.live and the live plans of
attnprobe_hooks.vllm.plan), without an engine (vLLM is not installed in the main venv).

Hand-built engine steps as a generating engine runs them: a prompt in prefill chunks, then decode steps of
one token each that feed the sampled tokens (which the live plan appends to its tokens). The scores at the
decision (last prompt token) and the reasoning start (the first fed token) equal attention computed by hand
on the same rows (``_naive``); a later request whose prefix-cache hit skips the first request's positions
takes the keys from the retained plan and equals the same request processed whole; a hit no plan holds
marks the plan failed without stopping the engine; which requests must read no prefix cache; when a
follow-up pass is needed; the retained store's budget.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnprobe_hooks.vllm import live
from attnprobe_hooks.vllm.plan import Plan, donor_order, match_step
from tests.unit.test_vllm_plan import _info, _naive

HEADS, KVH, D = 2, 1, 4
LAYERS = (0, 1)


def _rows(ids, p, layer):
    """q [H, d] and k [KVH, d] at position p of one layer, a function of tokens 0..p only (causal)."""
    g = torch.Generator().manual_seed((hash(tuple(int(x) for x in ids[: p + 1])) + 7919 * layer) % (2**31))
    return torch.randn(HEADS, D, generator=g), torch.randn(KVH, D, generator=g)


def _plan(tag, prompt, positions, *, max_new_tokens=4, segs=None, nseg=None, group="g"):
    n = len(prompt)
    segs = segs if segs is not None else list(range(n + 1))
    return Plan.from_wire(live.wire(tag, prompt, live.query_positions(n, positions, True), segs,
                                    nseg or len(segs), layers=None, max_new_tokens=max_new_tokens, group=group))


def _run(plans, seqs, steps, bound, prompts):
    """Engine steps: each a list of (request id, start, end) over ``seqs[rid]`` (prompt + fed tokens)."""
    for pieces in steps:
        qsl, pos, ids = [0], [], []
        for rid, s, e in pieces:
            ids += list(seqs[rid][s:e])
            pos += list(range(s, e))
            qsl.append(len(ids))
        mapped = match_step(plans, qsl, np.asarray(pos), np.asarray(ids), req_ids=[r for r, _, _ in pieces],
                            prompt_of=lambda r: prompts[r], bound=bound)
        for layer in LAYERS:
            q, k = [], []
            for rid, s, e in pieces:
                for p in range(s, e):
                    qr, kr = _rows(seqs[rid], p, layer)
                    q.append(qr.reshape(-1))
                    k.append(kr.reshape(-1))
            qf, kf = torch.stack(q), torch.stack(k)
            for sl in donor_order(mapped, layer):
                sl.plan.observe_layer(_info(layer, heads=HEADS, kv_heads=KVH, d=D), qf[sl.s:sl.e], kf[sl.s:sl.e],
                                      sl.start, donor=sl.donor, donor_from=sl.donor_from)
    return plans


def _expected(seq, qpos, segs, nseg, layer):
    m = int(max(qpos)) + 1
    q = torch.stack([_rows(seq, p, layer)[0] for p in range(m)]).numpy()
    k = torch.stack([_rows(seq, p, layer)[1] for p in range(m)]).numpy()
    return _naive(q, k, list(qpos), segs, nseg, 1.0 / np.sqrt(D))


def _check(plan, seq, segs=None, nseg=None):
    segs = segs if segs is not None else list(range(len(plan.scorer.seg_ids)))
    nseg = nseg or len(segs)
    for layer in LAYERS:
        got = plan.scorer.per_layer[layer].numpy()
        np.testing.assert_allclose(got, _expected(seq, plan.qpos, segs, nseg, layer), atol=1e-5)
        np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)  # whole softmax rows over keys 0 .. query


PROMPT_A = list(range(100, 112))  # 12 tokens
REPLY_A = [900, 901, 902, 903]


def test_prefill_then_decode_scores_the_decision_and_the_reasoning_start():
    seqs, prompts = {"r1": PROMPT_A + REPLY_A}, {"r1": PROMPT_A}
    segs = [0] * 6 + [1] * 6 + [2]  # keys 0..12: two prompt segments, the reply's first token its own
    plans = {"a": _plan("a", PROMPT_A, [4, 11], segs=segs, nseg=3)}
    bound = {}
    # a prefill of 12 tokens in chunks of 8 and 4, then three decode steps feeding 900, 901, 902
    _run(plans, seqs, [[("r1", 0, 8)], [("r1", 8, 12)], [("r1", 12, 13)], [("r1", 13, 14)], [("r1", 14, 15)]],
         bound, prompts)
    a = plans["a"]
    assert a.input_ids.tolist() == PROMPT_A + REPLY_A[:3] and a.seen == 15 and a.failed is None
    assert a.qpos.tolist() == [4, 11, 12]
    _check(a, seqs["r1"], segs, 3)
    assert live.followup_reason(a.report(), a.qpos) is None


def test_a_later_request_hits_the_retained_plan_and_equals_the_request_processed_whole():
    first = _run({"a": _plan("a", PROMPT_A, [11])}, {"r1": PROMPT_A + REPLY_A},
                 [[("r1", 0, 12)], [("r1", 12, 13)], [("r1", 13, 14)]], {}, {"r1": PROMPT_A})["a"]
    store = live.Retained(capacity=100)
    store.keep(first)
    prompt_b = PROMPT_A + REPLY_A[:2] + [300, 301, 302]  # extends what the first request fed (14 tokens)
    seqs, prompts = {"r2": prompt_b + [950, 951]}, {"r2": prompt_b}
    b = _plan("b", prompt_b, [len(prompt_b) - 1])
    b.peers = store.group("g")
    # the engine served 8 tokens from its prefix cache: the first slice starts at 8
    _run({"b": b}, seqs, [[("r2", 8, len(prompt_b))], [("r2", len(prompt_b), len(prompt_b) + 1)]], {}, prompts)
    assert b.hit == 8 and b.prefilled == len(prompt_b) - 8 + 1 and b.failed is None
    _check(b, seqs["r2"])
    whole = _run({"c": _plan("c", prompt_b, [len(prompt_b) - 1])}, {"r3": seqs["r2"]},
                 [[("r3", 0, len(prompt_b))], [("r3", len(prompt_b), len(prompt_b) + 1)]], {}, {"r3": prompt_b})["c"]
    for layer in LAYERS:
        assert torch.equal(b.scorer.per_layer[layer], whole.scorer.per_layer[layer])


def test_a_hit_no_plan_holds_marks_the_plan_failed_and_the_engine_goes_on():
    b = _plan("b", PROMPT_A, [11])  # no peers: nothing retained
    other = _plan("o", [5, 6, 7], [2])
    plans = {"b": b, "o": other}
    seqs, prompts = {"r2": PROMPT_A + [1], "r3": [5, 6, 7, 8]}, {"r2": PROMPT_A, "r3": [5, 6, 7]}
    _run(plans, seqs, [[("r2", 8, 12), ("r3", 0, 3)], [("r2", 12, 13), ("r3", 3, 4)]], {}, prompts)
    assert b.failed and "no plan of this call computed" in b.failed and 0 not in b.scorer.per_layer
    assert live.followup_reason({"failed": b.failed, "tokens_seen": 0}, b.qpos).startswith("a prefix-cache hit")
    _check(other, seqs["r3"])  # the other request was scored all the same


def test_which_requests_read_no_prefix_cache_and_which_need_a_follow_up():
    # hits are whole blocks of at most n - 1 tokens: with n = 300 and blocks of 128, at most 256
    assert not live.skip_prefix_cache([], 300, 128)
    assert not live.skip_prefix_cache([256, 299], 300, 128)
    assert live.skip_prefix_cache([255, 299], 300, 128)
    assert not live.skip_prefix_cache([100], 128, 128) and live.skip_prefix_cache([100], 129, 128)
    assert live.followup_reason({"tokens_seen": 12}, [11, 12]) == "the request fed 12 of the 13 positions its queries need"
    assert live.followup_reason({"tokens_seen": 13}, [11, 12]) is None
    assert live.query_positions(5, [1, 4], True) == [1, 4, 5] and live.query_positions(5, [4], False) == [4]
    with pytest.raises(ValueError, match="strictly increasing"):
        live.query_positions(5, [5], True)
    with pytest.raises(ValueError, match="key segments"):
        live.wire("t", [1, 2, 3], [2, 3], [0, 0, 0], 1, layers=None, max_new_tokens=2, group="g")


def test_the_retained_store_keeps_the_most_recently_used_within_its_budget():
    plans = []
    for i in range(3):
        p = _run({f"p{i}": _plan(f"p{i}", [i] * 6, [5])}, {"r": [i] * 6 + [9]}, [[("r", 0, 6)], [("r", 6, 7)]],
                 {}, {"r": [i] * 6})[f"p{i}"]
        plans.append(p)
    store = live.Retained(capacity=14)  # room for two plans of 7 positions
    store.keep(plans[0])
    store.keep(plans[1])
    store.touch([plans[0]])  # p0 served a hit: the most recent now
    plans[2].peers = [plans[1]]  # its call's other plan
    store.keep(plans[2])
    assert list(store.plans) == ["p0", "p2"] and store.tokens() == 14
    assert all(not p.peers and not p.shared_q for p in store.plans.values())  # nothing else kept alive
    assert [p.tag for p in store.group("g")] == ["p0", "p2"] and store.group("other") == []
    failed = _plan("f", [1, 2], [1])
    failed.failed = "x"
    store.keep(failed)
    assert "f" not in store.plans
    assert live.Retained(capacity=0).keep(plans[0]) is None and not live.Retained(capacity=0).plans
