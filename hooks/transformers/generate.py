"""Greedy generation that continues from the KV cache a capture just built, instead of prefilling again.

A study that captures a context and then asks for the model's next action at its decision position
(``--actions``, IBIS behaviour) used to prefill the context twice. Here the capture's cache (which
holds the whole plan: the prompt and, with teacher forcing, the step's own message after it) is
cropped to the prompt minus its last token, ``model.generate`` runs that one token and decodes, and
the cache is put back as it was (the layers' tensors are restored by reference: cropping slices them
and generation concatenates onto new tensors, so the captured keys are never written). Peak memory
during a generation is the captured cache plus the prompt's cache and the new tokens.

Greedy decoding only: the first new token comes from the same logits a full prefill would give
(within float rounding of the chunked prefill), and every later step is ``generate``'s own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from attnprobe_hooks.backend import (
    BackendOutput,
    BackendOutputs,
    CapturePlan,
    GenerationCounts,
    GenerationRequest,
    LoadedModel,
)
from attnprobe_hooks.transformers.prefill import cache_kw, crop_to, run_plans


def generate_from_cache(model: torch.nn.Module, cache: Any, prompt_ids: Sequence[int], *, max_new_tokens: int,
                        **generate_kwargs: Any) -> tuple[list[int], GenerationCounts]:
    """Greedy continuation of ``prompt_ids`` from ``cache``, which holds at least ``prompt_ids[:-1]``
    (checked by the caller: the cache's tokens must begin with the prompt). The cache is restored
    before returning. ``generate_kwargs`` go to ``model.generate`` (``eos_token_id``,
    ``pad_token_id``, ``stopping_criteria``, ...); sampling options are refused."""
    if generate_kwargs.get("do_sample"):
        raise ValueError("generation from the captured cache is greedy only")
    n = len(prompt_ids)
    if n < 1:
        raise ValueError("empty prompt")
    t0 = time.perf_counter()
    saved = [(layer.keys, layer.values) for layer in cache.layers]
    crop_to(cache, n - 1)
    device = next(model.parameters()).device
    ids = torch.as_tensor(list(prompt_ids), device=device)[None]
    try:
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, **{cache_kw(model): cache}, **generate_kwargs)
    finally:
        for layer, (k, v) in zip(cache.layers, saved):
            layer.keys, layer.values = k, v
    new = out[0, n:].tolist()
    return new, GenerationCounts(prompt_tokens=n, prefilled_tokens=1, new_tokens=len(new),
                                 seconds=time.perf_counter() - t0)


def capture_and_generate(loaded: LoadedModel, plans: Sequence[CapturePlan], requests: Sequence[GenerationRequest], *,
                         chunk_size: int, progress: bool = False) -> tuple[BackendOutputs, list[list[int]],
                                                                           list[GenerationCounts]]:
    """Capture ``plans`` with prefix sharing (:func:`~attnprobe_hooks.transformers.backend.run_plans`) and
    answer every request from the cache the capture built, once it holds the request's plan (e.g. the
    next action at a counterfactual context's decision position: ``prompt_length = prefix_tokens``).

    Returns (capture outputs in plan order, new token ids and counts in request order).
    """
    for r in requests:
        if not 0 <= r.plan < len(plans):
            raise ValueError(f"generation request for plan {r.plan}: there are {len(plans)} plans")
        if not 1 <= int(r.prompt_length) <= plans[r.plan].n:
            raise ValueError(f"plan {r.plan}: prompt length {r.prompt_length} is outside 1..{plans[r.plan].n}")
    by_plan: dict[int, list[int]] = {}
    for k, r in enumerate(requests):
        by_plan.setdefault(r.plan, []).append(k)
    new: list[list[int]] = [[] for _ in requests]
    counts: list[GenerationCounts | None] = [None] * len(requests)

    def after_plan(i: int, cache: Any) -> None:
        for k in by_plan.get(i, ()):
            r = requests[k]
            prompt = np.asarray(plans[i].input_ids)[: int(r.prompt_length)].tolist()
            new[k], counts[k] = generate_from_cache(loaded.model, cache, prompt, max_new_tokens=r.max_new_tokens,
                                                    **dict(r.kwargs))

    outputs = run_plans(loaded, plans, chunk_size=chunk_size, progress=progress, share_prefixes=True,
                        after_plan=after_plan)
    return outputs, new, counts  # type: ignore[return-value]


def capture_then_generate(loaded: LoadedModel, plan: CapturePlan, prompt_length: int, *, chunk_size: int,
                          max_new_tokens: int, **generate_kwargs: Any) -> tuple[BackendOutput, list[int],
                                                                                GenerationCounts]:
    """One plan: its capture, then the greedy continuation of its first ``prompt_length`` tokens."""
    outputs, new, counts = capture_and_generate(
        loaded, [plan], [GenerationRequest(0, prompt_length, max_new_tokens, generate_kwargs)], chunk_size=chunk_size)
    return outputs[0], new[0], counts[0]
