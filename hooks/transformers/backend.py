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

import torch
from tqdm.auto import tqdm

from attnprobe.errors import ModelNotFoundError
from attnprobe.model_files import canonical_dtype, display_name, resolve_spec, torch_dtype
from attnprobe_hooks.backend import BackendOutput, CapturePlan, LoadedModel
from attnprobe_hooks.transformers.attention import CaptureState, active, install


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


def chunked_prefill(model: torch.nn.Module, input_ids: torch.Tensor, chunk_size: int, *, progress: bool = False,
                    desc: str | None = None, on_chunk: Callable[[int, int], None] | None = None) -> None:
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


def run_plan(loaded: LoadedModel, plan: CapturePlan, *, chunk_size: int, progress: bool = False) -> BackendOutput:
    """One chunked prefill of one plan with the scoring attention function active."""
    model = loaded.model
    install(model)
    scorer = plan.new_scorer()
    state = CaptureState(scorer=scorer, qk_layers=set(plan.save_qk_layers))

    def on_chunk(s: int, _e: int) -> None:
        state.chunk_start = s

    with active(state):
        chunked_prefill(model, torch.as_tensor(plan.input_ids), chunk_size, progress=progress, desc=plan.desc,
                        on_chunk=on_chunk)
    qk = {}
    for layer in sorted(state.saved_q):
        qk[f"layer{layer}.q"] = torch.cat(state.saved_q[layer], dim=1)
        qk[f"layer{layer}.k"] = torch.cat(state.saved_k[layer], dim=1)
    cfg = getattr(model.config, "text_config", None) or model.config
    info = {"num_key_value_heads": getattr(cfg, "num_key_value_heads", None),
            "head_dim": getattr(cfg, "head_dim", None), "attention_calls": state.calls}
    return BackendOutput(scorer, qk, info)


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
            progress: bool = False) -> list[BackendOutput]:
        """Plans one after the other (batch size 1 per forward pass)."""
        return [run_plan(model, plan, chunk_size=chunk_size, progress=progress) for plan in plans]
