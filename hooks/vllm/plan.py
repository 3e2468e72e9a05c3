"""Capture plans inside a vLLM worker, and matching an engine step's rows to them.

Pure logic (numpy and torch, no vLLM import), so it is unit-tested without an engine
(``tests/unit/test_vllm_plan.py``).

An engine step is one flat batch: the rows of several requests back to back, each request's rows
``query_start_loc[i] .. query_start_loc[i+1]``, with their absolute ``positions`` and token ids.
The scheduler splits prompts into prefill chunks as it likes, so a request's rows in one step are a
contiguous piece ``start .. start + length`` of its prompt. :func:`match_step` gives every slice to
its plan: by the engine's request id, bound once to the plan whose tokens are the request's whole
prompt, when the worker can tell (``prompt_of``); otherwise by the plan whose tokens at that position
equal the slice's and that expects that start. Slices of requests that are not ours are ignored.

Where a slice may start:

- at the plan's cursor (the end of its previous slice): the usual next chunk;
- below it: the engine recomputes a preempted request (from 0, or from a prefix-cache hit). The rows
  the plan has already processed are identical, so they are skipped; ``restarts`` counts it;
- above 0 on a plan's first slice: a **prefix-cache hit** (prefix caching on, plans of one
  ``share_group``). The keys of positions ``0 .. start - 1`` never reach the hooks. They are the keys
  some other plan of the group (the *donor*, same tokens up to ``start``) computed or took itself, so
  the plan copies them from the donor's buffer, and the query rows it needs below ``start`` are rows
  the donor kept (``shared_q``; a row at p depends only on tokens 0..p). See docs/vllm.md, "Prefix
  sharing".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from attnprobe_hooks.scoring import QueryScorer
from attnprobe_hooks.sharing import common_prefix, lexicographic_order
from attnprobe_hooks.vllm.layers import LayerInfo


@dataclass(eq=False)
class Plan:
    """One trajectory being captured: its tokens, its scorer and its per-layer key buffers."""

    tag: str
    input_ids: np.ndarray
    scorer: QueryScorer
    n_keys: int  # keys buffered: up to the last query position, or the longest prefix a peer may copy
    qk_layers: set[int]
    share_group: str | None = None  # plans of one group may hit each other's prefix-cache blocks
    request: str | None = None  # the engine request bound to this plan by its whole prompt, when known
    next_start: int = 0  # the engine's cursor: where the request's next slice is expected
    seen: int = 0  # positions processed (keys buffered, rows scored); below it a recompute is skipped
    hit: int = 0  # prefix-cache hit of the first slice: positions taken from a donor
    prefilled: int = 0  # rows this plan's own request computed and the hooks processed
    steps: int = 0
    shared_steps: int = 0  # steps whose batch also held other requests
    restarts: int = 0
    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    saved_q: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    saved_k: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    done: dict[int, int] = field(default_factory=dict)  # layer -> positions processed in that layer
    peers: list[Plan] = field(default_factory=list)  # the other plans of the share group
    share_qpos: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # rows kept for peers
    shared_q: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)  # layer -> position -> [H, d]
    calls: int = 0
    qpos: np.ndarray | None = None  # query positions as numpy (cheap per-chunk test, no torch op)
    hook_seconds: float = 0.0  # time spent inside the hooks for this plan (overhead measure)
    # A live plan (attnprobe_hooks.vllm.live) follows a generation request past its prompt: the decode
    # steps feed the sampled tokens, which it appends to input_ids and whose keys it buffers too.
    live: bool = False
    failed: str | None = None  # a live plan whose request took a prefix no plan can serve (recaptured)

    @classmethod
    def from_wire(cls, p: Mapping[str, Any]) -> Plan:
        """A plan from the plain dict the driver sends (tag, input_ids, seg_ids, num_segments,
        query_positions, layers, qk_layers, share_group)."""
        ids = np.asarray(p["input_ids"], dtype=np.int64)
        qpos = torch.as_tensor(p["query_positions"], dtype=torch.long)
        scorer = QueryScorer(seg_ids=torch.as_tensor(p["seg_ids"], dtype=torch.long),
                             num_segments=int(p["num_segments"]), query_positions=qpos,
                             layers=None if p.get("layers") is None else [int(x) for x in p["layers"]])
        live = bool(p.get("live"))
        n_keys = int(p["key_capacity"]) if live else int(qpos.max()) + 1 if len(qpos) else 0
        return cls(tag=p["tag"], input_ids=ids, scorer=scorer, n_keys=n_keys,
                   qk_layers={int(x) for x in p.get("qk_layers", [])}, share_group=p.get("share_group"),
                   qpos=qpos.numpy().copy(), live=live)

    @property
    def n(self) -> int:
        return len(self.input_ids)

    def grow(self, start: int, ids: np.ndarray | None) -> None:
        """A live plan's slice at ``start`` that runs past its tokens: append the tokens fed beyond them
        (a decode step's sampled token, or the tail of a recompute after preemption)."""
        if not self.live or ids is None or start > self.n or start + len(ids) <= self.n:
            return
        self.input_ids = np.concatenate([self.input_ids, np.asarray(ids[self.n - start:], dtype=np.int64)])

    def has_query_in(self, start: int, end: int) -> bool:
        """Whether a query position lies in ``start .. end - 1``."""
        qpos = self.qpos if self.qpos is not None else self.scorer.query_positions.numpy()
        return bool(np.any((qpos >= start) & (qpos < end)))

    def _key_buffer(self, layer: int, like: torch.Tensor, kvh: int, d: int) -> torch.Tensor:
        buf = self.keys.get(layer)
        if buf is None:
            buf = torch.empty(kvh, self.n_keys, d, dtype=like.dtype, device=like.device)
            self.keys[layer] = buf
        return buf

    def _score_kw(self, info: LayerInfo) -> dict[str, Any]:
        return {"head_offset": info.head_offset, "total_heads": info.total_heads,
                "sliding_window": info.sliding_window, "softcap": info.softcap, "sinks": info.sinks}

    def receive(self, info: LayerInfo, donor: Plan, frm: int, upto: int, *,
                shared_keys_layer: int | None = None, device: torch.device | None = None) -> None:
        """Take positions ``frm .. upto - 1`` of one layer from ``donor`` (a prefix-cache hit; ``frm`` is 0
        unless a recompute after preemption hits past what the plan had processed).

        Copies the donor's keys (unless the layer reads another layer's keys: KV sharing) and the query
        rows it kept, then scores this plan's queries in that range from those rows. Exact: both plans
        hold the same tokens up to ``upto``, and a row or key at p depends only on tokens 0..p.
        """
        layer = info.layer
        if donor.done.get(layer, 0) < upto:
            raise RuntimeError(f"attnprobe: {self.tag} needs positions 0..{upto - 1} of layer {layer} from "
                               f"{donor.tag}, which has processed {donor.done.get(layer, 0)}")
        stop = min(upto, self.n_keys)
        if shared_keys_layer is None and stop > frm:
            src = donor.keys.get(layer)
            if src is None or src.shape[1] < stop:
                raise RuntimeError(f"attnprobe: {donor.tag} holds no keys {frm}..{upto - 1} of layer {layer}")
            self._key_buffer(layer, src, src.shape[0], src.shape[2])[:, frm:stop] = src[:, frm:stop]
        rows = self.shared_q.setdefault(layer, {})
        rows.update({p: r for p, r in donor.shared_q.get(layer, {}).items() if frm <= p < upto})
        qpos = self.qpos if self.qpos is not None else self.scorer.query_positions.numpy()
        lo, hi = (int(x) for x in np.searchsorted(qpos, [frm, upto]))
        k_buf = self.keys.get(layer if shared_keys_layer is None else shared_keys_layer)
        if hi > lo and k_buf is not None:
            missing = [int(p) for p in qpos[lo:hi] if int(p) not in rows]
            if missing and self.live:  # scored again by a follow-up (attnprobe_hooks.vllm.live)
                self.failed = f"no query rows at {missing[:5]} after a prefix-cache hit"
                return
            if missing:
                raise RuntimeError(f"attnprobe: {donor.tag} kept no query rows at {missing[:5]} for {self.tag}")
            q_rows = torch.stack([rows[int(p)] for p in qpos[lo:hi]], dim=1)
            last = int(qpos[hi - 1]) + 1
            self.scorer.score_rows(layer, q_rows, lo, k_buf[:, :last], 0, info.scale, **self._score_kw(info))
        else:
            self.scorer.init_layer(layer, info.total_heads, device)
        self.done[layer] = upto

    def observe_layer(self, info: LayerInfo, query: torch.Tensor, key: torch.Tensor | None, start: int, *,
                      shared_keys_layer: int | None = None, donor: Plan | None = None,
                      donor_from: int = 0) -> None:
        """One layer's rows of this plan in one step: buffer the keys, score the query rows in it.

        query: [length, local_heads * head_dim] (flat, as vLLM hands it), key: [length,
        local_kv_heads * head_dim], or None when the layer reuses the keys of ``shared_keys_layer``
        (KV sharing). ``start``: absolute position of the first row. ``donor``: after a prefix-cache hit,
        the plan whose positions ``donor_from .. start - 1`` this one takes (:meth:`receive`).
        Keys are kept only up to ``n_keys``. Rows are scored against every key so far, at this rank's
        head offset; rows a peer may need later are kept (``share_qpos``).
        """
        layer = info.layer
        if not self.scorer.wants(layer) or self.failed:
            return
        self.calls += 1
        if donor is not None:
            self.receive(info, donor, donor_from, start, shared_keys_layer=shared_keys_layer, device=query.device)
        h, kvh, d = info.num_heads, info.num_kv_heads, info.head_dim
        length = int(query.shape[0])
        end = start + length
        q = query.reshape(length, h, d)
        k = None
        if key is not None:
            k = key.reshape(length, kvh, d)
            if start < self.n_keys:
                stop = min(end, self.n_keys)
                self._key_buffer(layer, k, kvh, d)[:, start:stop] = k[: stop - start].transpose(0, 1)
            k_buf = self.keys.get(layer)
        else:  # KV shared with an earlier layer: read that layer's keys
            k_buf = self.keys.get(shared_keys_layer) if shared_keys_layer is not None else None
        if k_buf is not None and self.has_query_in(start, end):
            stop = min(end, self.n_keys, len(self.scorer.seg_ids))  # a live plan buffers keys past its queries'
            self.scorer.score_layer(layer, q.transpose(0, 1), k_buf[:, :stop], start, 0, info.scale,
                                    **self._score_kw(info))
        else:
            self.scorer.init_layer(layer, info.total_heads, q.device)
        if len(self.share_qpos):
            lo, hi = np.searchsorted(self.share_qpos, [start, end])
            if hi > lo:
                rows = self.shared_q.setdefault(layer, {})
                for p in self.share_qpos[lo:hi]:
                    rows[int(p)] = q[int(p) - start].clone()
        self.done[layer] = end
        if layer in self.qk_layers:  # kept on the device until the plan is collected
            self.saved_q.setdefault(layer, []).append(q.transpose(0, 1).clone())
            if k is not None and info.kv_replica_first:
                self.saved_k.setdefault(layer, []).append(k.transpose(0, 1).clone())

    def report(self) -> dict[str, Any]:
        """The JSON-able counters the driver checks and records."""
        return {"tokens_seen": self.seen, "n": self.n, "prefix_cache_hit": self.hit, "prefilled": self.prefilled,
                "request_bound": self.request is not None,
                "steps": self.steps, "shared_steps": self.shared_steps, "calls": self.calls,
                "restarts": self.restarts, "hook_seconds": round(self.hook_seconds, 4)}


def arm_sharing(plans: Sequence[Plan]) -> None:
    """Prepare the plans of each ``share_group`` to serve each other's prefix-cache hits.

    In lexicographic order of their tokens, the longest common prefix (LCP) of two plans is the
    smallest LCP of neighbours between them. A plan buffers keys up to its longest LCP with any peer
    (a peer may copy them) and keeps the query row at p when a peer that shares more than p tokens with
    it queries p (a peer may need it): rows, not positions, so the masked and the original contexts of a
    counterfactual step keep only the rows they could really exchange.
    """
    groups: dict[str, list[Plan]] = {}
    for p in plans:
        if p.share_group is not None:
            groups.setdefault(p.share_group, []).append(p)
    empty = np.zeros(0, dtype=np.int64)
    for members in groups.values():
        if len(members) < 2:
            continue
        order = lexicographic_order([m.input_ids for m in members])
        adjacent = [common_prefix(members[a].input_ids, members[b].input_ids) for a, b in zip(order, order[1:])]
        needs: dict[int, list[np.ndarray]] = {i: [] for i in range(len(members))}
        longest = [0] * len(members)
        for r, i in enumerate(order):
            lcp = None
            for t in range(r + 1, len(order)):
                j = order[t]
                lcp = adjacent[t - 1] if lcp is None else min(lcp, adjacent[t - 1])
                if lcp == 0:
                    break
                longest[i], longest[j] = max(longest[i], lcp), max(longest[j], lcp)
                qi = members[i].qpos if members[i].qpos is not None else empty
                qj = members[j].qpos if members[j].qpos is not None else empty
                needs[i].append(qj[qj < lcp])
                needs[j].append(qi[qi < lcp])
        for i, m in enumerate(members):
            m.n_keys = min(m.n, max(m.n_keys, longest[i]))
            m.share_qpos = np.unique(np.concatenate(needs[i])) if needs[i] else empty
            m.peers = [x for x in members if x is not m]


class StepSlice(NamedTuple):
    """Rows ``s .. e - 1`` of a flat engine step belong to ``plan``, starting at absolute position ``start``;
    ``donor``: after a prefix-cache hit, the plan positions ``donor_from .. start - 1`` come from."""

    plan: Plan
    s: int
    e: int
    start: int
    donor: Plan | None = None
    donor_from: int = 0


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


def _candidate(plans: Mapping[str, Plan], used: set[str], start: int, ids: np.ndarray | None) -> Plan | None:
    """Without request ids: the plan whose tokens at ``start`` equal the slice's, preferring one that
    expects ``start``, then a fresh plan (``start`` 0, or a prefix-cache hit in a share group), then a
    recompute of an advanced one."""
    length = len(ids) if ids is not None else 0
    fresh = again = None
    for cand in plans.values():
        if cand.tag in used or start + length > cand.n:
            continue
        if ids is not None and not np.array_equal(cand.input_ids[start:start + length], ids):
            continue
        if cand.next_start == start:
            return cand
        if start > 0 and cand.share_group is None:
            continue  # without a prefix cache, only the next chunk or a recompute from 0
        if cand.next_start == 0:
            fresh = fresh or cand
        elif start < cand.next_start:
            again = again or cand
    return fresh or again


def match_step(plans: Mapping[str, Plan], qsl: Sequence[int], positions: np.ndarray,
               input_ids: np.ndarray | None, *, req_ids: Sequence[str | None] | None = None,
               prompt_of: Callable[[str], Sequence[int] | None] | None = None,
               bound: dict[str, str | None] | None = None) -> list[StepSlice]:
    """Match every request slice of a step to a plan, advancing the plans (see the module docstring).

    With ``req_ids`` (one per slice), ``prompt_of`` and ``bound`` (the request-id -> plan-tag map kept
    across steps), a request is bound on first sight to a free plan whose tokens are its whole prompt,
    and its slices go to that plan. Without them, slices are matched by tokens and position. Each plan
    takes at most one slice per step; rows below the plan's ``seen`` (a recompute) are cut off the
    slice. Every matched plan counts the step, and the step as shared when it held more than one
    request. Prefix-cache hits get their donor (:func:`assign_donors`).
    """
    mapped: list[StepSlice] = []
    used: set[str] = set()
    taken = set(bound.values()) if bound is not None else set()
    seen_before = {tag: p.seen for tag, p in plans.items()}
    firsts: list[int] = []
    for i in range(len(qsl) - 1):
        s, e = qsl[i], qsl[i + 1]
        if e <= s:
            continue
        start = int(positions[s])
        ids = input_ids[s:e] if input_ids is not None else None
        if ids is None and len(plans) > 1:
            raise RuntimeError("attnprobe: the model got no input_ids (embeddings input); "
                               "capture one trajectory per generate call")
        plan = None
        if req_ids is not None and bound is not None and prompt_of is not None:
            rid = req_ids[i]
            if rid is None:
                continue
            if rid not in bound:
                prompt = prompt_of(rid)
                tag = None
                if prompt is not None:
                    prompt = np.asarray(prompt, dtype=np.int64)
                    tag = next((t for t, p in plans.items() if t not in taken and p.n == len(prompt)
                                and np.array_equal(p.input_ids, prompt)), None)
                bound[rid] = tag
                if tag is not None:
                    taken.add(tag)
                    plans[tag].request = rid
            plan = plans.get(bound[rid]) if bound[rid] is not None else None
            if plan is not None and plan.failed:
                continue
            if plan is not None:
                plan.grow(start, ids)
            if plan is not None and ids is not None and not np.array_equal(plan.input_ids[start:e - s + start], ids):
                raise RuntimeError(f"attnprobe: request {rid} ({plan.tag}) computed tokens at {start} that differ "
                                   "from its prompt")
        else:
            plan = _candidate(plans, used, start, ids)
        if plan is None or plan.tag in used:
            continue
        used.add(plan.tag)
        plan.steps += 1
        end = start + (e - s)
        frm = None
        if start > plan.next_start:
            # Only a prefix-cache hit skips positions: on a plan's first slice, or on a recompute after
            # preemption that hits blocks a peer computed past what this plan had processed.
            if plan.share_group is None:
                raise RuntimeError(f"attnprobe: the engine skipped positions {plan.next_start}..{start - 1} of "
                                   f"{plan.tag}")
            if start > plan.seen:
                frm = plan.seen
                plan.hit += start - plan.seen
                firsts.append(len(mapped))
        if start != plan.next_start and plan.next_start > 0:
            plan.restarts += 1  # a recompute (from 0 or from a hit) of a preempted request
        plan.next_start = end
        skip = min(max(0, plan.seen - start), e - s)  # rows a recompute repeats: processed already
        if start + skip < end:
            mapped.append(StepSlice(plan, s + skip, e, start + skip, donor_from=frm or 0))
            plan.prefilled += end - start - skip
        plan.seen = max(plan.seen, end)
    if sum(1 for i in range(len(qsl) - 1) if qsl[i + 1] > qsl[i]) > 1:
        for tag in used:
            plans[tag].shared_steps += 1
    return assign_donors(mapped, firsts, seen_before)


def _no_donor(sl: StepSlice) -> str:
    return (f"attnprobe: vLLM reused {sl.start} cached tokens for {sl.plan.tag} that no plan of "
            "this call computed; capture with --no-prefix-sharing")


def assign_donors(mapped: list[StepSlice], firsts: Sequence[int], seen_before: Mapping[str, int]) -> list[StepSlice]:
    """Give each prefix-cache hit (``mapped[i]`` for i in ``firsts``) a donor among its plan's peers.

    A donor holds the same tokens up to the hit and will have processed them when the hit is served:
    a plan done before this step, one in this step that takes nothing from a donor, or a hit of this
    step already given a donor at an earlier or equal start. Hits are served in that order, so donors
    never form a cycle (:func:`donor_order`). A peer outside ``seen_before`` (a live plan retained from an
    earlier call: :mod:`attnprobe_hooks.vllm.live`) has processed what it has seen.

    A live plan without a donor does not stop the engine: it is marked ``failed``, its slice dropped,
    and the driver captures its call after the fact; any other plan without one raises.
    """
    out = list(mapped)
    in_step = {sl.plan.tag: sl for sl in mapped}
    hits = set(firsts)
    ready: set[str] = {sl.plan.tag for i, sl in enumerate(mapped) if i not in hits}
    dropped: set[int] = set()
    for i in sorted(firsts, key=lambda j: mapped[j].start):
        sl = mapped[i]
        donor = None
        for peer in sl.plan.peers:
            if peer.failed or common_prefix(peer.input_ids[: sl.start], sl.plan.input_ids[: sl.start]) < sl.start:
                continue
            if seen_before.get(peer.tag, peer.seen) >= sl.start and peer.tag not in in_step:
                donor = peer
                break
            if peer.tag in ready and peer.seen >= sl.start:
                donor = donor or peer
        if donor is None:
            if not sl.plan.live:
                raise RuntimeError(_no_donor(sl))
            sl.plan.failed = _no_donor(sl)
            dropped.add(i)
            continue
        out[i] = sl._replace(donor=donor)
        ready.add(sl.plan.tag)
    return [sl for i, sl in enumerate(out) if i not in dropped]


def donor_order(step_map: Sequence[StepSlice], layer: int) -> Iterator[StepSlice]:
    """The step's slices in an order where every donor has processed ``layer`` up to the hit it serves.

    Lazy: whether a donor is ready is checked after the caller has processed the slices before it.
    """
    pending = list(step_map)
    while pending:
        for i, sl in enumerate(pending):
            if sl.donor is None or not sl.plan.scorer.wants(layer) or sl.donor.done.get(layer, 0) >= sl.start:
                yield pending.pop(i)
                break
        else:
            raise RuntimeError(f"attnprobe: layer {layer}: no donor is ready for "
                               f"{', '.join(sl.plan.tag for sl in pending)}")
