"""Helpers for the prefix-sharing tests: a brute-force prefix trie and the array-by-array comparison."""

from __future__ import annotations

import numpy as np

from attnprobe_hooks.backend import CapturePlan

TOL = 1e-5
BLOCK = 128  # vLLM-CPU's default prefix-cache block size
VOCAB = 49152  # SmolLM2's vocabulary (the random test llamas use its tokenizer)


def brute_trie(seqs) -> int:
    """Distinct non-empty prefixes of the sequences (the prefix trie's node count)."""
    return len({tuple(np.asarray(s)[:i].tolist()) for s in seqs for i in range(1, len(s) + 1)})


def assert_same(shared, alone, plans, tol: float = TOL) -> dict[str, float]:
    """Every array of two runs' backend outputs (per-layer segment sums per head, per-token row sums,
    saved q/k) agrees within ``tol``; returns the max |diff| by kind."""
    worst = {"segment": 0.0, "token": 0.0, "qk": 0.0}
    assert len(shared) == len(alone) == len(plans)
    for a, b in zip(shared, alone):
        assert sorted(a.scorer.per_layer) == sorted(b.scorer.per_layer)
        for layer, arr in b.scorer.per_layer.items():
            assert a.scorer.per_layer[layer].shape == arr.shape
            d = float((a.scorer.per_layer[layer] - arr).abs().max())
            assert d <= tol, (layer, d)
            worst["segment"] = max(worst["segment"], d)
        assert a.scorer.token_sum.shape == b.scorer.token_sum.shape
        d = float((a.scorer.token_sum - b.scorer.token_sum).abs().max())
        assert d <= tol, d
        worst["token"] = max(worst["token"], d)
        assert sorted(a.qk) == sorted(b.qk)
        for name, t in b.qk.items():
            assert a.qk[name].shape == t.shape, name
            d = float((a.qk[name] - t).abs().max())
            assert d <= tol, (name, d)
            worst["qk"] = max(worst["qk"], d)
    return worst


def token_plan(ids, queries, *, seg_every: int = 5, seg_offset: int = 0, layers=None, qk=()) -> CapturePlan:
    """A plan over raw token ids: segments of ``seg_every`` tokens (shifted by ``seg_offset``)."""
    ids = np.asarray(ids, dtype=np.int64)
    seg = (np.arange(len(ids)) + seg_offset) // seg_every
    seg -= seg[0]
    return CapturePlan(input_ids=ids, token_segment=seg, num_segments=int(seg[-1]) + 1,
                       query_positions=tuple(int(q) for q in queries), layers=layers, save_qk_layers=tuple(qk))


def random_tokens(n: int, seed: int = 0, *, low: int = 0, high: int = 40) -> np.ndarray:
    return np.random.default_rng(seed).integers(low, high, size=n)


def branch(base: np.ndarray, at: int, tail: int, seed: int, *, low: int = 0, high: int = 40) -> np.ndarray:
    """``base[:at]`` then ``tail`` random tokens, the first of which differs from ``base[at]``."""
    extra = np.random.default_rng(seed).integers(low, high, size=tail)
    if at < len(base) and tail:
        extra[0] = low + (base[at] + 1 - low) % (high - low)
    return np.concatenate([base[:at], extra])


def vllm_plan_sets() -> dict[str, list[CapturePlan]]:
    """Hand-built plan sets around vLLM's prefix-cache blocks (``BLOCK`` tokens; token ids of a real vocabulary)."""

    def _p(ids, queries, *, seg_every=37, **kw):
        return token_plan(ids, queries, seg_every=seg_every, **kw)

    b = random_tokens(600, low=100, high=VOCAB)
    return {
        # the same tokens three times: other queries, other segments; two of them hit 512 cached tokens
        "identical": [_p(b, [3, 200, 599]), _p(b, [0, 130, 511, 512, 599], seg_every=3, seg_offset=1),
                      _p(b, [127, 128, 599], seg_every=600)],
        # a plan that is a prefix of another: its queries inside the cached blocks come from the long one
        "prefix": [_p(b, [5, 599]), _p(b[:300], [2, 255, 256, 299]), _p(b[:300], [299], seg_every=4)],
        "branch_on_block_boundaries": [_p(b, [127, 128, 255, 256, 599]),
                                       _p(branch(b, 2 * BLOCK, 200, 1, low=100, high=VOCAB), [127, 128, 255, 256, 400]),
                                       _p(branch(b, 2 * BLOCK + 1, 90, 2, low=100, high=VOCAB), [255, 256, 257, 300]),
                                       _p(branch(b, 2 * BLOCK - 1, 90, 3, low=100, high=VOCAB), [254, 255, 300])],
        "branch_inside_a_block_and_chunk": [_p(b, [95, 96, 200, 599]),
                                            _p(branch(b, 200, 150, 4, low=100, high=VOCAB), [95, 96, 199, 200, 349]),
                                            _p(branch(b, 300, 5, 5, low=100, high=VOCAB), [10, 299, 300, 304])],
        "branch_at_token_1": [_p(b[:400], [0, 1, 399]), _p(branch(b, 1, 399, 6, low=100, high=VOCAB), [0, 1, 399])],
        "branch_at_last_token": [_p(b, [10, 598, 599]), _p(branch(b, 599, 1, 7, low=100, high=VOCAB), [10, 598, 599])],
        "queries_in_shared_prefix": [_p(branch(b, 450, 20, 8, low=100, high=VOCAB), [1, 8, 300, 449]), _p(b, [2, 8, 300, 449, 450]),
                                     _p(branch(b, 520, 4, 9, low=100, high=VOCAB), [7, 8, 519, 520])],
        "same_tokens_other_labels": [_p(b, [9, 190, 390, 599], seg_every=2),
                                     _p(b, [9, 190, 390, 599], seg_every=130),
                                     _p(b, [9, 190, 390, 599], seg_every=600)],
        # saving q/k turns sharing off for that plan (its own salt); the others still share
        "qk_saved_next_to_sharing": [_p(b, [12, 599], qk=(0, 1)), _p(b, [12, 599]),
                                     _p(branch(b, 400, 10, 10, low=100, high=VOCAB), [16, 409])],
        "no_common_prefix": [_p(branch(b, 0, 300, 11, low=100, high=VOCAB), [299]), _p(b[:250], [249])],
    }
