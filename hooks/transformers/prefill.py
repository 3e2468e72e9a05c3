"""The transformers capture pass: chunked prefills with the scoring attention function active, one plan
after the other, each unique token prefilled once when plans share prefixes (:func:`run_plans`).

Kept apart from the backend class (:mod:`attnprobe_hooks.transformers.backend`: loading, the
registry's object) so that generation from the captured cache
(:mod:`attnprobe_hooks.transformers.generate`) builds on it without an import cycle.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from attnprobe.io.bars import plain_bar
from attnprobe_hooks.backend import BackendOutput, BackendOutputs, CapturePlan, LoadedModel
from attnprobe_hooks.sharing import lexicographic_order, schedule, stats
from attnprobe_hooks.transformers.attention import CaptureState, PlanTarget, active, install


def cache_kw(module: torch.nn.Module) -> str:
    """The keyword ``module.forward`` takes a KV cache by: newer transformers name it ``cache``
    (``past_key_values`` is deprecated). Shared by the prefill, generation from its cache and the chat."""
    try:
        return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"
    except (TypeError, ValueError):
        return "past_key_values"


def _chunks(start: int, end: int, chunk_size: int) -> list[tuple[int, int]]:
    """[start, end) cut on the grid of multiples of ``chunk_size`` (a pass that starts mid-chunk after a
    crop runs the rest of that chunk first, so its chunks are the ones a prefill from 0 would run)."""
    bounds = [start, *range((start // chunk_size + 1) * chunk_size, end, chunk_size), end]
    return [(s, e) for s, e in zip(bounds, bounds[1:]) if e > s]


def chunked_prefill(model: torch.nn.Module, input_ids: torch.Tensor, chunk_size: int, *, progress: bool = False,
                    desc: str | None = None, on_chunk: Callable[[int, int], None] | None = None,
                    cache: Any = None, start: int = 0) -> None:
    """Feed ``input_ids[start:]`` through the decoder in chunks sharing one KV cache; no logits, no sampling.

    ``cache``: a cache already holding ``input_ids[:start]`` (default: a new one, ``start`` = 0).
    """
    from transformers import DynamicCache

    base = model.base_model  # the decoder stack: skipping lm_head saves a [chunk, vocab] matmul per chunk
    own = cache is None
    if own:
        cache = DynamicCache(config=model.config)
    n = int(input_ids.shape[0])
    device = next(model.parameters()).device
    chunks = _chunks(start, n, chunk_size)
    bar = tqdm(chunks, desc=desc or "prefill", unit="chunk", disable=not progress, leave=False, **plain_bar())
    cache_kw_name = cache_kw(base)
    ids = input_ids[start:].to(device).unsqueeze(0)  # one copy to the device, not one per chunk
    with torch.inference_mode():
        for s, e in bar:
            if on_chunk is not None:
                on_chunk(s, e)
            base(input_ids=ids[:, s - start:e - start], use_cache=True,
                 position_ids=torch.arange(s, e, device=device).unsqueeze(0), **{cache_kw_name: cache})
    if own:
        del cache


def _output(model: torch.nn.Module, target: PlanTarget) -> BackendOutput:
    """The plan's output on the host: its scores in one device-to-host copy (:meth:`QueryScorer.to_host`),
    and the q/k it was asked to keep (float32)."""
    qk = {}
    for layer in sorted(target.saved_q):
        qk[f"layer{layer}.q"] = torch.cat(target.saved_q[layer], dim=1).float().cpu()
        qk[f"layer{layer}.k"] = torch.cat(target.saved_k[layer], dim=1).float().cpu()
    target.scorer.to_host()
    cfg = getattr(model.config, "text_config", None) or model.config
    info = {"num_key_value_heads": getattr(cfg, "num_key_value_heads", None),
            "head_dim": getattr(cfg, "head_dim", None), "attention_calls": target.calls}
    return BackendOutput(target.scorer, qk, info)


def shared_cache() -> Any:
    """The one cache a sharing run crops and extends: full layers everywhere (a sliding-window layer
    drops keys that a crop may need again; the mask still applies each layer's window)."""
    from transformers import DynamicCache

    return DynamicCache()


def _cached_length(cache: Any) -> int:
    return int(cache.get_seq_length()) if len(cache.layers) else 0


def crop_to(cache: Any, length: int) -> None:
    """Drop every cached position >= ``length``."""
    extra = _cached_length(cache) - length
    if extra > 0:
        cache.crop(-extra)


def run_plans(loaded: LoadedModel, plans: Sequence[CapturePlan], *, chunk_size: int, progress: bool = False,
              share_prefixes: bool = True, after_plan: Callable[[int, Any], None] | None = None) -> BackendOutputs:
    """Chunked prefills of ``plans`` with the scoring attention function active; outputs in plan order.

    ``share_prefixes``: prefill each unique token once (plans in lexicographic order, one cache cropped to
    the common prefix before each; see :mod:`attnprobe_hooks.sharing`). Off: one prefill per plan from
    token 0 with its own cache, as before. ``after_plan(i, cache)``: called once per plan, when the cache
    holds exactly plan i's tokens; it may extend the cache (e.g. generate from it) if it crops it back to
    ``len(plan i)`` before returning.
    """
    from transformers import DynamicCache

    model = loaded.model
    install(model)
    ids = [np.asarray(p.input_ids) for p in plans]
    passes = {ps.plan: ps for ps in schedule(ids, share=share_prefixes)}
    targets = [PlanTarget(scorer=p.new_scorer(), qk_layers=set(p.save_qk_layers)) for p in plans]
    cache = shared_cache() if share_prefixes else None
    for i in lexicographic_order(ids) if share_prefixes else range(len(plans)):
        ps = passes.get(i)  # None: identical to the plan before it, whose cache it reuses as is
        if ps is not None:
            if share_prefixes:
                crop_to(cache, ps.start)
            else:
                cache = DynamicCache(config=model.config)
            state = CaptureState(targets=[(targets[j], limit) for j, limit in ps.shares])

            def on_chunk(s: int, _e: int, state: CaptureState = state) -> None:
                state.chunk_start = s

            with active(state):
                chunked_prefill(model, torch.as_tensor(ids[i]), chunk_size, progress=progress, desc=plans[i].desc,
                                on_chunk=on_chunk, cache=cache, start=ps.start)
        if after_plan is not None:
            after_plan(i, cache)
    out = BackendOutputs(_output(model, t) for t in targets)
    out.sharing = stats(ids, list(passes.values()), shared=share_prefixes)
    return out


def run_plan(loaded: LoadedModel, plan: CapturePlan, *, chunk_size: int, progress: bool = False) -> BackendOutput:
    """One chunked prefill of one plan with the scoring attention function active."""
    return run_plans(loaded, [plan], chunk_size=chunk_size, progress=progress, share_prefixes=False)[0]
