"""Prefix sharing, backend-neutral: which tokens each prefill pass runs and which query rows it scores.

Many plans of a study share long prefixes (successive steps of a trajectory, the contexts of several
policies, the calls of an agent run). Sorted in lexicographic order of their token ids, each plan
shares its longest common prefix (LCP) with its predecessor, so one KV cache cropped to that LCP
before each plan prefills every unique token exactly once: the sum of the passes is the size of the
plans' prefix trie.

A query row at position p depends only on the tokens 0..p (causal attention), so it is the same row
for every plan whose tokens agree with the running one up to p. Pass k therefore scores, for every
plan j at or after it in sorted order, plan j's queries at positions in ``[start_k, limit_kj)`` with
``limit_kj = lcp(plan_k, plan_j)`` (``len(plan_k)`` for j = k). Every query row of every plan is
scored in exactly one pass: the first one that prefills its position while agreeing with its plan
up to it. Each plan keeps its own scorer (segments, labels, layers), so two plans with the same
tokens but different segments are aggregated separately from the same rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Pass:
    """One prefill: plan ``plan``'s tokens ``[start, end)`` after cropping the cache to ``start``.

    ``shares``: (plan index j, limit) for every plan whose rows this pass scores, at positions in
    ``[start, limit)`` (the running plan itself first, with limit ``end``).
    """

    plan: int
    start: int
    end: int
    shares: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class SharingStats:
    """What a set of plans costs: tokens in the plans (one prefill each, from token 0, as without
    sharing) against tokens actually prefilled, and the size of their prefix trie (the floor)."""

    plans: int
    plan_tokens: int
    prefilled_tokens: int
    trie_tokens: int
    shared: bool

    @property
    def reuse_ratio(self) -> float:
        """Tokens in the plans per token prefilled (1.0 without sharing)."""
        return self.plan_tokens / self.prefilled_tokens if self.prefilled_tokens else 1.0

    def as_dict(self) -> dict:
        return {"plans": self.plans, "plan_tokens": self.plan_tokens, "prefilled_tokens": self.prefilled_tokens,
                "trie_tokens": self.trie_tokens, "reuse_ratio": round(self.reuse_ratio, 4), "shared": self.shared}

    def line(self) -> str:
        """The one-line report: tokens in the plans, tokens prefilled, reuse ratio."""
        mode = "prefix sharing" if self.shared else "no prefix sharing"
        return (f"{self.plans} plans, {self.plan_tokens:,} tokens; prefilled {self.prefilled_tokens:,} "
                f"(trie {self.trie_tokens:,}); reuse {self.reuse_ratio:.2f}x ({mode})")

    def __add__(self, other: SharingStats) -> SharingStats:
        return SharingStats(self.plans + other.plans, self.plan_tokens + other.plan_tokens,
                            self.prefilled_tokens + other.prefilled_tokens, self.trie_tokens + other.trie_tokens,
                            self.shared and other.shared)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token-id arrays."""
    m = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:m]) != np.asarray(b[:m]))
    return int(diff[0]) if len(diff) else m


def lexicographic_order(token_ids: Sequence[np.ndarray]) -> list[int]:
    """Plan indices sorted by token ids (a prefix before its extensions; ties by index)."""
    keys = [tuple(np.asarray(t).tolist()) for t in token_ids]
    return sorted(range(len(keys)), key=lambda i: (keys[i], i))


def schedule(token_ids: Sequence[np.ndarray], *, share: bool = True) -> list[Pass]:
    """The prefill passes for plans with these token ids (see the module docstring).

    ``share=False``: one pass per plan from token 0, in the given order (today's independent prefills).
    With sharing, a plan identical to its predecessor gets no pass: its rows were all scored earlier.
    """
    ids = [np.asarray(t) for t in token_ids]
    if not share:
        return [Pass(i, 0, len(t), ((i, len(t)),)) for i, t in enumerate(ids)]
    order = lexicographic_order(ids)
    nxt = [common_prefix(ids[order[k]], ids[order[k + 1]]) for k in range(len(order) - 1)]
    passes = []
    for k, i in enumerate(order):
        start, end = (nxt[k - 1] if k else 0), len(ids[i])
        if start >= end:  # identical to the previous plan (a prefix sorts before its extensions)
            continue
        shares = [(i, end)]
        limit = end
        for k2 in range(k + 1, len(order)):
            limit = min(limit, nxt[k2 - 1])
            if limit <= start:
                break
            shares.append((order[k2], limit))
        passes.append(Pass(i, start, end, tuple(shares)))
    return passes


def stats(token_ids: Sequence[np.ndarray], passes: Sequence[Pass], *, shared: bool) -> SharingStats:
    """Counts for a schedule: tokens in the plans, tokens its passes prefill, the trie size."""
    ids = [np.asarray(t) for t in token_ids]
    return SharingStats(plans=len(ids), plan_tokens=sum(len(t) for t in ids),
                        prefilled_tokens=sum(p.end - p.start for p in passes), trie_tokens=trie_size(ids), shared=shared)


def trie_size(token_ids: Sequence[np.ndarray]) -> int:
    """Tokens in the plans' prefix trie: each plan's length minus its LCP with its predecessor in
    lexicographic order (each distinct prefix counted once)."""
    ids = [np.asarray(t) for t in token_ids]
    order = lexicographic_order(ids)
    return sum(len(ids[i]) - (common_prefix(ids[order[k - 1]], ids[i]) if k else 0) for k, i in enumerate(order))
