"""Capture while a vLLM engine generates: the live plans of generation requests (pure parts).

Pure logic (numpy and torch, no vLLM import), unit-tested without an engine (``tests/unit/test_vllm_live.py``);
the engine side is :mod:`attnprobe_hooks.vllm.generate` (driver) and :mod:`attnprobe_hooks.vllm.extension`
(worker). What is scored follows :mod:`attnprobe.generation.capturing` (issue 40): for a request with prompt
``p[0..n-1]``,

- listed prompt positions (the decision: ``n - 1``), scored in the request's prefill;
- the **reasoning start**: position ``n``, the reply's first token, scored at the first decode step, which
  feeds it back;

each against every key ``0 ..`` its position of the request's context, in the segments the caller gives
for the keys ``0 .. n``. A live plan (:meth:`attnprobe_hooks.vllm.plan.Plan.from_wire` with ``live``)
follows its request past the prompt, appending the tokens the decode steps feed and buffering their keys.

Keys a prefix-cache hit skips were computed by an earlier request the hooks followed: a live plan of this
call or one *retained* from an earlier call (:class:`Retained`), and are copied from it (exact: a key at p
depends only on tokens 0..p). Live requests carry one prefix-cache salt per layer selection, so they only
ever hit blocks that live requests computed. Query rows are never copied: a request whose listed positions a
hit could skip reads no prefix cache (:func:`skip_prefix_cache`: vLLM's hits are whole blocks, at most
``n - 1`` tokens, so the decision is always computed). A request a hit left without keys (its donor was
evicted) or whose reply ended at its first token (never fed back) is scored again by a **follow-up**: one
request over the prompt and the reply's first token, with no prefix cache read (:func:`followup_reason`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any


def query_positions(n: int, positions: Sequence[int], reply_start: bool) -> list[int]:
    """Every position a live plan of a prompt of ``n`` tokens scores: the listed ones, then ``n``."""
    pos = [int(p) for p in positions]
    if any(b <= a for a, b in zip(pos, pos[1:])) or (pos and (pos[0] < 0 or pos[-1] >= n)):
        raise ValueError(f"capture positions {pos} must be strictly increasing prompt positions (< {n})")
    return pos + ([n] if reply_start else [])


def skip_prefix_cache(positions: Sequence[int], n: int, block: int) -> bool:
    """Whether a request must read no prefix cache so that its listed positions are computed in it.

    vLLM serves at most ``n - 1`` prompt tokens from its cache, in whole blocks of ``block`` tokens, so
    a hit ends at or before ``(n - 1) // block * block``; a position below that may be skipped."""
    return bool(positions) and int(min(positions)) < (n - 1) // int(block) * int(block)


def wire(tag: str, prompt: Sequence[int], qpos: Sequence[int], seg_ids: Sequence[int], num_segments: int, *,
         layers: Sequence[int] | None, max_new_tokens: int, group: str) -> dict[str, Any]:
    """The plain dict :meth:`attnprobe_hooks.vllm.plan.Plan.from_wire` reads for a live plan.

    ``seg_ids``: the segment of every key the queries see (``0 .. max(qpos)``). Keys are buffered for
    every position the request can feed (``n + max_new_tokens``): a later request may take them from its
    prefix cache.
    """
    n = len(prompt)
    if not qpos:
        raise ValueError(f"{tag}: a live plan scores at least one position")
    if len(seg_ids) < int(qpos[-1]) + 1:
        raise ValueError(f"{tag}: {len(seg_ids)} key segments for queries up to position {qpos[-1]}")
    return {"tag": tag, "input_ids": [int(x) for x in prompt], "seg_ids": [int(x) for x in seg_ids],
            "num_segments": int(num_segments), "query_positions": [int(p) for p in qpos],
            "layers": None if layers is None else [int(x) for x in layers], "qk_layers": [], "share_group": group,
            "live": True, "key_capacity": n + max(1, int(max_new_tokens))}


def followup_reason(report: dict[str, Any], qpos: Sequence[int]) -> str | None:
    """Why a live plan's rows are incomplete, so its request is scored again by a follow-up, or None.

    ``report``: the worker's counters for the plan (``failed``: a prefix-cache hit no plan could serve;
    ``tokens_seen``: positions the request fed)."""
    if report.get("failed"):
        return "a prefix-cache hit no retained plan held"
    need = int(max(qpos)) + 1
    if int(report["tokens_seen"]) < need:
        return f"the request fed {report['tokens_seen']} of the {need} positions its queries need"
    return None


class Retained:
    """Live plans kept in a worker after their call, so later requests' prefix-cache hits can copy their
    keys: least recently used first out, up to ``capacity`` positions in all (0: keep none)."""

    def __init__(self, capacity: int = 0) -> None:
        self.capacity = int(capacity)
        self.plans: OrderedDict[str, Any] = OrderedDict()

    def tokens(self) -> int:
        return sum(p.seen for p in self.plans.values())

    def keep(self, plan: Any) -> None:
        """Keep a finished live plan (its scorer and saved rows dropped: only its keys serve later hits)."""
        if plan.failed or self.capacity <= 0:
            return
        plan.shared_q = {}
        plan.peers = []  # its call's other plans: not kept alive through it
        self.plans[plan.tag] = plan
        while self.plans and self.tokens() > self.capacity:
            self.plans.popitem(last=False)

    def group(self, group: str | None) -> list[Any]:
        """Retained plans of one share group (one layer selection), most recent last."""
        return [p for p in self.plans.values() if p.share_group == group]

    def touch(self, plans: Sequence[Any]) -> None:
        """Mark donors just used as the most recent."""
        for p in plans:
            if p.tag in self.plans:
                self.plans.move_to_end(p.tag)

    def clear(self) -> None:
        self.plans.clear()
