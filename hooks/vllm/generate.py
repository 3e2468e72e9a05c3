"""One vLLM engine that generates and captures (driver side; issue 40, item 2).

The generation engine carries the capture extension (:meth:`attnprobe.generation.vllm_chat.VllmChat.open`
with ``capture=True``: ``worker_extension_cls``, eager, prefix caching on, vLLM's V1 model runner).
:func:`generate` arms a live plan per request that asks for capture (:mod:`attnprobe_hooks.vllm.live`: the
listed prompt positions, such as the decision, scored in the request's prefill, and the reasoning start at
the reply's first token, scored at the first decode step, which feeds it back), runs one ``llm.generate``
and collects every rank's shard of each plan: the RPCs and the shard merge of
:func:`attnprobe_hooks.vllm.backend.run_batch`, so the scores are a :class:`~attnprobe_hooks.scoring.QueryScorer`
in the capture backend's format. Requests whose rows a live pass could not complete are scored by one
follow-up pass (prompt + the reply's first token, no prefix cache read), on the same engine.

Live requests carry one prefix-cache salt per layer selection (``aplive-<pid>|<layers>``): they hit the
blocks of earlier live requests (an earlier turn of the episode, another rollout's shared prompt), never
blocks the hooks did not follow. Each rank keeps the keys of up to ``retain_tokens`` positions of
finished live plans to serve those hits (:class:`attnprobe_hooks.vllm.live.Retained`); :func:`forget` drops them.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe_hooks.backend import CapturePlan
from attnprobe_hooks.scoring import QueryScorer
from attnprobe_hooks.vllm import live
from attnprobe_hooks.vllm.backend import VllmModel, merge_shards, scored_layers

DEFAULT_RETAIN_TOKENS = 65536  # positions of finished live plans each rank keeps for later prefix-cache hits
_CALLS = itertools.count()


@dataclass
class LiveRequest:
    """One generation request; ``positions`` None: generate without capture. Otherwise the prompt positions
    scored in its prefill, ``reply_start``: also the reply's first token; ``segments``: the segment of every
    key ``0 .. len(prompt)`` (``num_segments`` in all); ``layers``: None for every attention layer."""

    prompt: list[int]
    params: Any  # vllm.SamplingParams
    positions: list[int] | None = None
    reply_start: bool = True
    segments: list[int] | None = None
    num_segments: int = 0
    layers: list[int] | None = None


@dataclass
class LiveResult:
    """A request's scores (on the host): query positions ``positions (+ n)``; ``token_ids``: the keys'
    tokens ``0 .. n`` (the prompt, then the reply's first token)."""

    scorer: QueryScorer
    token_ids: list[int]
    prefilled: int  # prompt tokens this request's passes computed (the rest came from the prefix cache)
    info: dict[str, Any] = field(default_factory=dict)


def _check(loaded: VllmModel) -> None:
    if loaded.model is None:
        raise AttnprobeError("this vLLM engine was closed; open it again")
    if not loaded.ranks:
        raise AttnprobeError("this vLLM engine carries no capture extension: open the generator with capture on")
    if not all(r.get("binds_requests") for r in loaded.ranks):
        raise AttnprobeError("capture during generation needs vLLM's V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0): "
                             "the hooks bind requests to plans by engine request id")


def _skipping(params: Any) -> Any:
    """A copy of ``params`` that reads no prefix cache."""
    out = params.clone()
    out.skip_reading_prefix_cache = True
    return out


def _pass(loaded: VllmModel, items: Sequence[tuple[list[int], Any, list[int] | None, LiveRequest]],
          retain_tokens: int) -> tuple[list[Any], list[dict | None], float]:
    """One ``llm.generate`` over ``(prompt, params, qpos or None, request)`` items, live plans armed for those
    with query positions. Returns (RequestOutputs, per item None or {tag, keep, report, shards}, seconds)."""
    from safetensors.torch import load as st_load
    from vllm.inputs import TokensPrompt

    llm = loaded.model
    call = next(_CALLS)
    block = int(llm.llm_engine.vllm_config.cache_config.block_size)
    wire, picks, prompts, params = [], [], [], []
    for i, (prompt, p, qpos, req) in enumerate(items):
        if qpos is None:
            prompts.append(TokensPrompt(prompt_token_ids=prompt))
            params.append(p)
            picks.append(None)
            continue
        keep, _ = scored_layers(loaded, req.layers)
        group = f"aplive-{os.getpid()}|{keep}"
        tag = f"aplive{os.getpid()}-{call}-{i}"
        segs = req.segments if req.segments is not None else list(range(len(req.prompt) + 1))
        nseg = req.num_segments if req.segments is not None else len(req.prompt) + 1
        wire.append(live.wire(tag, prompt, qpos, segs, nseg, layers=keep, max_new_tokens=int(p.max_tokens or 1),
                              group=group))
        listed = [q for q in qpos if q < len(prompt) - 1]
        skip = bool(getattr(p, "skip_reading_prefix_cache", False)) or live.skip_prefix_cache(listed, len(prompt), block)
        prompts.append(TokensPrompt(prompt_token_ids=prompt, cache_salt=group))
        params.append(_skipping(p) if skip and not getattr(p, "skip_reading_prefix_cache", False) else p)
        picks.append({"tag": tag, "keep": keep, "segs": segs, "nseg": nseg, "qpos": qpos, "skip": skip})
    t0 = time.perf_counter()
    if wire:
        llm.collective_rpc("attnprobe_live_begin", args=(wire, int(retain_tokens)))
    try:
        outputs = llm.generate(prompts, params, use_tqdm=False)
        results = llm.collective_rpc("attnprobe_collect") if wire else []
    except BaseException:
        if wire:
            try:
                llm.collective_rpc("attnprobe_abort")
            except Exception:
                pass
        raise
    seconds = time.perf_counter() - t0
    shards = [(r, st_load(r["tensors"]) if r["tensors"] else {}) for r in results]
    for pick in picks:
        if pick is not None:
            reports = [meta["plans"][pick["tag"]] for meta, _ in shards]
            pick["report"] = {"failed": next((r["failed"] for r in reports if r.get("failed")), None),
                              "tokens_seen": min(r["tokens_seen"] for r in reports),
                              "prefix_cache_hit": max(r["prefix_cache_hit"] for r in reports)}
            pick["shards"] = shards
    return outputs, picks, seconds


def _scores(loaded: VllmModel, pick: dict, token_ids: list[int]) -> tuple[QueryScorer, dict]:
    plan = CapturePlan(input_ids=np.asarray(token_ids, dtype=np.int64),
                       token_segment=np.asarray(pick["segs"][: len(token_ids)], dtype=np.int64),
                       num_segments=pick["nseg"], query_positions=tuple(pick["qpos"]), layers=pick["keep"])
    scorer, _, stats = merge_shards(loaded, plan, pick["keep"], pick["tag"], pick["shards"])
    return scorer.to_host(), stats


def generate(loaded: VllmModel, requests: Sequence[LiveRequest], *,
             retain_tokens: int = DEFAULT_RETAIN_TOKENS) -> tuple[list[Any], list[LiveResult | None]]:
    """Generate every request in one ``llm.generate``; score those that ask while they run.

    Returns (vLLM's RequestOutputs in request order, one :class:`LiveResult` or None per request)."""
    _check(loaded)
    items = []
    for r in requests:
        qpos = None if r.positions is None else live.query_positions(len(r.prompt), r.positions, r.reply_start)
        items.append(([int(x) for x in r.prompt], r.params, qpos or None, r))
    outputs, picks, seconds = _pass(loaded, items, retain_tokens)
    results: list[LiveResult | None] = [None] * len(requests)
    again: list[tuple[int, str]] = []
    for i, (r, out, pick) in enumerate(zip(requests, outputs, picks)):
        if pick is None:
            continue
        why = live.followup_reason(pick["report"], pick["qpos"])
        if why is not None:
            again.append((i, why))
            continue
        n = len(r.prompt)
        ids = [*map(int, r.prompt), int(out.outputs[0].token_ids[0])]  # the engine samples at least one token
        scorer, stats = _scores(loaded, pick, ids)
        hit = int(pick["report"]["prefix_cache_hit"])
        results[i] = LiveResult(scorer, ids, n - hit, {
            "captured_in": "generation", "prefix_cache_hit_tokens": hit, "read_prefix_cache": not pick["skip"],
            "attention_calls": stats["calls"], "hook_seconds": stats["hook_seconds"], "batch_rows": len(requests),
            "pass_seconds": round(seconds, 3)})
    if again:
        from vllm import SamplingParams

        one = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, skip_reading_prefix_cache=True)
        follow = []
        for i, _ in again:
            r = requests[i]
            ids = [*map(int, r.prompt), int(outputs[i].outputs[0].token_ids[0])]
            follow.append((ids, one, picks[i]["qpos"], r))
        _, fpicks, fsec = _pass(loaded, follow, retain_tokens)
        for (i, why), (ids, _, _, r), pick in zip(again, follow, fpicks):
            if live.followup_reason(pick["report"], pick["qpos"]) is not None:
                raise AttnprobeError(f"request {i + 1}: its follow-up pass did not score positions {pick['qpos']}")
            scorer, stats = _scores(loaded, pick, ids)
            first = picks[i]["report"]
            results[i] = LiveResult(scorer, ids, len(r.prompt) - int(first["prefix_cache_hit"]) + len(ids), {
                "captured_in": "generation, then a follow-up pass", "followup": why,
                "prefix_cache_hit_tokens": int(first["prefix_cache_hit"]), "read_prefix_cache": False,
                "attention_calls": stats["calls"], "hook_seconds": stats["hook_seconds"],
                "batch_rows": len(requests), "pass_seconds": round(seconds + fsec, 3)})
    return outputs, results


def forget(loaded: VllmModel) -> int:
    """Drop the keys every rank retained for later hits (returns rank 0's count of positions)."""
    _check(loaded)
    return int(loaded.model.collective_rpc("attnprobe_live_forget")[0])
