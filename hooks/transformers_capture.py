"""Chunked prefill on a transformers model with the attnprobe attention function active."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from attnprobe_hooks.scoring import QueryScorer
from attnprobe_hooks.transformers_hooks import CaptureState, active, install


def chunked_prefill(model, input_ids: torch.Tensor, chunk_size: int, *, progress: bool = False,
                    desc: str | None = None, on_chunk=None) -> None:
    """Feed ``input_ids`` [n] through the decoder in chunks sharing one KV cache; no logits, no sampling."""
    from transformers import DynamicCache

    base = model.base_model  # the decoder stack: skipping lm_head saves a [chunk, vocab] matmul per chunk
    cache = DynamicCache(config=model.config)
    n = int(input_ids.shape[0])
    device = next(model.parameters()).device
    starts = range(0, n, chunk_size)
    bar = tqdm(starts, desc=desc or "prefill", unit="chunk", disable=not progress, leave=False)
    cache_kw = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
    with torch.inference_mode():
        for s in bar:
            e = min(n, s + chunk_size)
            if on_chunk is not None:
                on_chunk(s, e)
            base(input_ids=input_ids[s:e].unsqueeze(0).to(device), use_cache=True,
                 position_ids=torch.arange(s, e, device=device).unsqueeze(0), **{cache_kw: cache})
    del cache


def run_capture(loaded, rendered, points, layers: Sequence[int] | None, *, chunk_size: int,
                save_qk_layers: Sequence[int] = (), progress: bool = False, desc: str | None = None):
    """Returns (scorer, qk tensors by name, extra metadata)."""
    model = loaded.model
    install(model)
    scorer = QueryScorer(
        seg_ids=torch.as_tensor(rendered.token_segment), num_segments=len(rendered.segments),
        query_positions=torch.as_tensor([p.position for p in points]), layers=None if layers is None else list(layers),
    )
    state = CaptureState(scorer=scorer, qk_layers=set(save_qk_layers))

    def on_chunk(s, _e):
        state.chunk_start = s

    with active(state):
        chunked_prefill(model, torch.as_tensor(rendered.input_ids), chunk_size, progress=progress, desc=desc,
                        on_chunk=on_chunk)
    qk = {}
    for layer in sorted(state.saved_q):
        qk[f"layer{layer}.q"] = torch.cat(state.saved_q[layer], dim=1)
        qk[f"layer{layer}.k"] = torch.cat(state.saved_k[layer], dim=1)
    cfg = getattr(model.config, "text_config", None) or model.config
    info = {"num_key_value_heads": getattr(cfg, "num_key_value_heads", None),
            "head_dim": getattr(cfg, "head_dim", None), "attention_calls": state.calls}
    return scorer, qk, info
