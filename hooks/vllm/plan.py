"""Capture plans inside a vLLM worker, and matching an engine step's rows to them.

Pure logic (numpy and torch, no vLLM import), so it is unit-tested without an engine
(``tests/unit/test_vllm_plan.py``).

An engine step is one flat batch: the rows of several requests back to back, each request's rows
``query_start_loc[i] .. query_start_loc[i+1]``, with their absolute ``positions`` and token ids.
The scheduler splits prompts into prefill chunks as it likes, so a request's rows in one step are a
contiguous piece ``start .. start + length`` of its prompt. :func:`match_step` finds, for every
slice, the plan whose prompt holds exactly those tokens at that position and that expects that
start (the end of its previous chunk). A slice starting at 0 for a plan that already advanced is a
recompute after preemption: the plan is reset and its restarts counted. Slices that match no plan
(requests that are not ours, e.g. a warm-up) are ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from attnprobe_hooks.scoring import QueryScorer
from attnprobe_hooks.vllm.layers import LayerInfo


@dataclass
class Plan:
    """One trajectory being captured: its tokens, its scorer and its per-layer key buffers."""

    tag: str
    input_ids: np.ndarray
    scorer: QueryScorer
    n_keys: int  # keys needed: up to the last query position
    qk_layers: set[int]
    next_start: int = 0
    steps: int = 0
    shared_steps: int = 0  # steps whose batch also held other requests
    restarts: int = 0
    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    saved_q: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    saved_k: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    calls: int = 0
    qpos: np.ndarray | None = None  # query positions as numpy (cheap per-chunk test, no torch op)
    hook_seconds: float = 0.0  # time spent inside the hooks for this plan (overhead measure)

    @classmethod
    def from_wire(cls, p: Mapping[str, Any]) -> Plan:
        """A plan from the plain dict the driver sends (tag, input_ids, seg_ids, num_segments,
        query_positions, layers, qk_layers)."""
        ids = np.asarray(p["input_ids"], dtype=np.int64)
        qpos = torch.as_tensor(p["query_positions"], dtype=torch.long)
        scorer = QueryScorer(seg_ids=torch.as_tensor(p["seg_ids"], dtype=torch.long),
                             num_segments=int(p["num_segments"]), query_positions=qpos,
                             layers=None if p.get("layers") is None else [int(x) for x in p["layers"]])
        return cls(tag=p["tag"], input_ids=ids, scorer=scorer, n_keys=int(qpos.max()) + 1 if len(qpos) else 0,
                   qk_layers={int(x) for x in p.get("qk_layers", [])}, qpos=qpos.numpy().copy())

    @property
    def n(self) -> int:
        return len(self.input_ids)

    def reset(self) -> None:
        """Start over (the engine recomputes a preempted request from position 0)."""
        self.scorer.reset()
        self.keys.clear()
        self.saved_q.clear()
        self.saved_k.clear()
        self.next_start = 0
        self.restarts += 1

    def has_query_in(self, start: int, end: int) -> bool:
        """Whether a query position lies in ``start .. end - 1``."""
        qpos = self.qpos if self.qpos is not None else self.scorer.query_positions.numpy()
        return bool(np.any((qpos >= start) & (qpos < end)))

    def observe_layer(self, info: LayerInfo, query: torch.Tensor, key: torch.Tensor | None, start: int, *,
                      shared_keys_layer: int | None = None,
                      arange: Callable[[int], torch.Tensor] = torch.arange) -> None:
        """One layer's rows of this plan in one step: buffer the keys, score the query rows in it.

        query: [length, local_heads * head_dim] (flat, as vLLM hands it), key: [length,
        local_kv_heads * head_dim], or None when the layer reuses the keys of ``shared_keys_layer``
        (KV sharing). ``start``: absolute position of the first row. Keys are kept only up to the
        last query position. Rows are scored against every key so far, at this rank's head offset.
        """
        layer = info.layer
        if not self.scorer.wants(layer):
            return
        self.calls += 1
        h, kvh, d = info.num_heads, info.num_kv_heads, info.head_dim
        length = int(query.shape[0])
        end = start + length
        q = query.reshape(length, h, d)
        k = None
        if key is not None:
            k = key.reshape(length, kvh, d)
            if start < self.n_keys:
                buf = self.keys.get(layer)
                if buf is None:
                    buf = torch.empty(kvh, self.n_keys, d, dtype=k.dtype, device=k.device)
                    self.keys[layer] = buf
                stop = min(end, self.n_keys)
                buf[:, start:stop] = k[: stop - start].transpose(0, 1)
            k_buf = self.keys.get(layer)
        else:  # KV shared with an earlier layer: read that layer's keys
            k_buf = self.keys.get(shared_keys_layer) if shared_keys_layer is not None else None
        if k_buf is not None and self.has_query_in(start, end):
            stop = min(end, self.n_keys)
            self.scorer.score_layer(
                layer, q.transpose(0, 1), k_buf[:, :stop], start, arange(stop), info.scale,
                head_offset=info.head_offset, total_heads=info.total_heads,
                sliding_window=info.sliding_window, softcap=info.softcap, sinks=info.sinks)
        else:
            self.scorer.init_layer(layer, info.total_heads)
        if layer in self.qk_layers:
            self.saved_q.setdefault(layer, []).append(q.transpose(0, 1).float().cpu().clone())
            if k is not None and info.kv_replica_first:
                self.saved_k.setdefault(layer, []).append(k.transpose(0, 1).float().cpu().clone())

    def report(self) -> dict[str, Any]:
        """The JSON-able counters the driver checks and records."""
        return {"tokens_seen": self.next_start, "n": self.n, "steps": self.steps, "shared_steps": self.shared_steps,
                "calls": self.calls, "restarts": self.restarts, "hook_seconds": round(self.hook_seconds, 4)}


class StepSlice(NamedTuple):
    """Rows ``s .. e - 1`` of a flat engine step belong to ``plan``, starting at absolute position ``start``."""

    plan: Plan
    s: int
    e: int
    start: int


def query_start_loc(md: Any, runner: Any = None) -> list[int] | None:
    """Request boundaries of the step: the attention metadata's ``query_start_loc`` (or the runner's buffer)."""
    qsl = getattr(md, "query_start_loc", None)
    if qsl is None and runner is not None:
        buf = getattr(runner, "query_start_loc", None)
        qsl = getattr(buf, "cpu", None) if buf is not None else None
        if qsl is not None:
            num_reqs = getattr(getattr(runner, "input_batch", None), "num_reqs", None)
            qsl = qsl[: num_reqs + 1] if num_reqs is not None else None
    if qsl is None:
        return None
    return [int(x) for x in qsl.tolist()]


def step_arrays(input_ids: torch.Tensor | None, positions: torch.Tensor,
                total: int) -> tuple[np.ndarray | None, np.ndarray]:
    """(token ids or None, absolute positions) of the first ``total`` rows of a step, as numpy.

    M-RoPE models pass positions as [3, tokens]; row 0 is the text position.
    """
    pos = positions.reshape(-1)[:total].cpu().numpy() if positions.dim() == 1 else positions[0, :total].cpu().numpy()
    ids = input_ids[:total].cpu().numpy() if input_ids is not None else None
    return ids, pos


def match_step(plans: Mapping[str, Plan], qsl: Sequence[int], positions: np.ndarray,
               input_ids: np.ndarray | None) -> list[StepSlice]:
    """Match every request slice of a step to a plan, advancing the plans (see the module docstring).

    A slice matches a plan when the plan's tokens at ``start .. start + length`` equal the slice's
    ids and the plan expects ``start``; failing that, a slice at position 0 with the right tokens
    is a preempted plan being recomputed (reset, ``restarts`` + 1). Each plan takes at most one
    slice per step. Every matched plan counts the step, and the step as shared when it held more
    than one request.
    """
    mapped: list[StepSlice] = []
    used: set[str] = set()
    for i in range(len(qsl) - 1):
        s, e = qsl[i], qsl[i + 1]
        if e <= s:
            continue
        start = int(positions[s])
        length = e - s
        plan = None
        for cand in plans.values():
            if cand.tag in used or start + length > cand.n:
                continue
            if input_ids is not None and not np.array_equal(cand.input_ids[start:start + length], input_ids[s:e]):
                continue
            if input_ids is None and len(plans) > 1:
                raise RuntimeError("attnprobe: the model got no input_ids (embeddings input); "
                                   "capture one trajectory per generate call")
            if cand.next_start == start:
                plan = cand
                break
            if start == 0 and plan is None:
                plan = cand  # recompute after preemption (only if no fresh plan matches)
        if plan is None:
            continue
        if start == 0 and plan.next_start > 0:
            plan.reset()
        used.add(plan.tag)
        plan.next_start = start + length
        plan.steps += 1
        mapped.append(StepSlice(plan, s, e, start))
    if sum(1 for i in range(len(qsl) - 1) if qsl[i + 1] > qsl[i]) > 1:
        for sl in mapped:
            sl.plan.shared_steps += 1
    return mapped
