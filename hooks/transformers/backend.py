"""transformers capture backend: load a model with the attnprobe attention function, run chunked prefills.

Plans run one at a time (one trajectory per forward pass, batch size 1): the attention function in
:mod:`attnprobe_hooks.transformers.attention` scores each chunk's query rows against every key in
the cache, then delegates to SDPA (or the model's eager function).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from attnprobe.errors import ModelNotFoundError
from attnprobe.model_files import canonical_dtype, display_name, resolve_spec, torch_dtype
from attnprobe_hooks.backend import BackendOutput, BackendOutputs, CapturePlan, LoadedModel
from attnprobe_hooks.sharing import lexicographic_order, schedule, stats
from attnprobe_hooks.transformers.attention import CaptureState, PlanTarget, active, install


def _bars_off() -> bool:
    return os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "").lower() in ("1", "true", "yes", "on")


def _quiet_gguf_bar() -> None:
    """transformers draws its GGUF de-quantization bar with tqdm directly, past its own progress switch:
    wrap it once so it honours the hub's switch (``HF_HUB_DISABLE_PROGRESS_BARS``, which
    ``--no-progress`` / ``-q`` set), read at each call."""
    import transformers.modeling_gguf_pytorch_utils as gguf

    if getattr(gguf.tqdm, "_attnprobe", False):
        return
    bar = gguf.tqdm

    def tqdm(*args, **kwargs):
        kwargs["disable"] = kwargs.get("disable", False) or _bars_off()
        return bar(*args, **kwargs)

    tqdm._attnprobe = True
    gguf.tqdm = tqdm


_CACHE: dict[tuple, LoadedModel] = {}


def _cache_kw(base: torch.nn.Module) -> str:
    """Newer transformers name the KV-cache argument ``cache`` (``past_key_values`` is deprecated)."""
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


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
    bar = tqdm(chunks, desc=desc or "prefill", unit="chunk", disable=not progress, leave=False)
    cache_kw = _cache_kw(base)
    with torch.inference_mode():
        for s, e in bar:
            if on_chunk is not None:
                on_chunk(s, e)
            base(input_ids=input_ids[s:e].unsqueeze(0).to(device), use_cache=True,
                 position_ids=torch.arange(s, e, device=device).unsqueeze(0), **{cache_kw: cache})
    if own:
        del cache


def _output(model: torch.nn.Module, target: PlanTarget) -> BackendOutput:
    qk = {}
    for layer in sorted(target.saved_q):
        qk[f"layer{layer}.q"] = torch.cat(target.saved_q[layer], dim=1)
        qk[f"layer{layer}.k"] = torch.cat(target.saved_k[layer], dim=1)
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


class TransformersBackend:
    """:class:`~attnprobe_hooks.backend.CaptureBackend` for Hugging Face transformers models."""

    name = "transformers"
    load_options = ("device", "attn_implementation")

    def load(self, spec: str | os.PathLike, *, dtype: str = "float32", device: str = "cpu",
             attn_implementation: str = "sdpa", **kwargs: Any) -> LoadedModel:
        """Load ``spec`` (cached per process) and switch it to the attnprobe attention function.

        ``attn_implementation="eager"`` keeps the model's eager semantics under capture (needed for
        soft-capping or attention sinks).
        """
        if kwargs:
            raise TypeError(f"unexpected arguments for the transformers backend: {', '.join(kwargs)}")
        dtype = canonical_dtype(dtype)
        key = (str(spec), self.name, dtype, device, attn_implementation)
        if key in _CACHE:
            return _CACHE[key]
        source, where, gguf_file = resolve_spec(spec)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        kw: dict[str, Any] = {"local_files_only": True}
        if gguf_file:
            kw["gguf_file"] = gguf_file
            _quiet_gguf_bar()
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(where), **kw)
            model = AutoModelForCausalLM.from_pretrained(
                str(where), dtype=torch_dtype(dtype), attn_implementation=attn_implementation, **kw)
        except OSError as exc:
            if source == "hf-cache":
                raise ModelNotFoundError(
                    f"model {spec!r} is not a local folder, a .gguf file, or a model in the local Hugging Face "
                    f"cache; attnprobe never downloads at run time (fetch it beforehand). Detail: {exc}") from None
            raise ModelNotFoundError(f"could not load model from {where}: {exc}") from None
        model.to(device)
        model.eval()
        impl = install(model)
        loaded = LoadedModel(model=model, tokenizer=tokenizer, spec=str(spec), name=display_name(str(spec), source, where),
                             backend=self.name, dtype=dtype, source=source, attn_implementation=impl,
                             extra={"path": str(Path(where) / gguf_file) if gguf_file else str(where), "device": device})
        _CACHE[key] = loaded
        return loaded

    def run(self, model: LoadedModel, plans: Sequence[CapturePlan], *, chunk_size: int,
            progress: bool = False, share_prefixes: bool = True) -> BackendOutputs:
        """Plans one pass after the other (batch size 1 per forward pass), each unique token prefilled
        once unless ``share_prefixes`` is off (see :func:`run_plans`)."""
        return run_plans(model, plans, chunk_size=chunk_size, progress=progress, share_prefixes=share_prefixes)

    def capture_and_generate(self, model: LoadedModel, plans: Sequence[CapturePlan], requests: Sequence[Any], *,
                             chunk_size: int, progress: bool = False):
        """Capture with prefix sharing and continue each ``GenerationRequest`` greedily from the cache the
        capture built (:func:`attnprobe_hooks.transformers.generate.capture_and_generate`)."""
        from attnprobe_hooks.transformers.generate import capture_and_generate

        return capture_and_generate(model, plans, requests, chunk_size=chunk_size, progress=progress)
