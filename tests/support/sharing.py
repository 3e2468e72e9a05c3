"""Helpers for the prefix-sharing tests: a brute-force prefix trie and the array-by-array comparison."""

from __future__ import annotations

import numpy as np

TOL = 1e-5


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
