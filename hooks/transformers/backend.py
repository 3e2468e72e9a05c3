"""transformers capture backend: load a model with the attnprobe attention function, run chunked prefills.

Plans run one at a time (one trajectory per forward pass, batch size 1): the attention function in
:mod:`attnprobe_hooks.transformers.attention` scores each chunk's query rows against every key in
the cache, then delegates to SDPA (or the model's eager function). The pass itself is
:mod:`attnprobe_hooks.transformers.prefill` (re-exported here); generation from its cache is
:mod:`attnprobe_hooks.transformers.generate`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnprobe.errors import ModelNotFoundError
from attnprobe.io.bars import plain_bar
from attnprobe.model_files import canonical_dtype, display_name, resolve_spec, torch_dtype
from attnprobe_hooks.backend import BackendOutputs, CapturePlan, LoadedModel
from attnprobe_hooks.transformers.attention import install
from attnprobe_hooks.transformers.generate import capture_and_generate
from attnprobe_hooks.transformers.prefill import chunked_prefill, crop_to, run_plan, run_plans, shared_cache

__all__ = ["TransformersBackend", "chunked_prefill", "crop_to", "run_plan", "run_plans", "shared_cache"]


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
        return bar(*args, **{**plain_bar(), **kwargs})

    tqdm._attnprobe = True
    gguf.tqdm = tqdm


_CACHE: dict[tuple, LoadedModel] = {}


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
        gguf_path = Path(where) / gguf_file if gguf_file else None
        if gguf_path is not None and os.environ.get("ATTNPROBE_GGUF_CACHE", "1") != "0":
            # the converted folder (cached on disk by content and dtype) holds the same tensors
            from attnprobe.model_convert import converted_folder

            where = converted_folder(gguf_path, dtype=dtype, progress=False)
            gguf_file = None
        elif gguf_file:
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
                             extra={"path": str(gguf_path or where), "device": device,
                                    **({"converted": str(where)} if gguf_path and not gguf_file else {})})
        _CACHE[key] = loaded
        return loaded

    def unload(self, model: LoadedModel) -> None:
        """Forget a loaded model (the per-process cache holds it until then), so its memory can be freed."""
        for key in [k for k, v in _CACHE.items() if v is model]:
            del _CACHE[key]

    def run(self, model: LoadedModel, plans: Sequence[CapturePlan], *, chunk_size: int,
            progress: bool = False, share_prefixes: bool = True) -> BackendOutputs:
        """Plans one pass after the other (batch size 1 per forward pass), each unique token prefilled
        once unless ``share_prefixes`` is off (see :func:`run_plans`)."""
        return run_plans(model, plans, chunk_size=chunk_size, progress=progress, share_prefixes=share_prefixes)

    def capture_and_generate(self, model: LoadedModel, plans: Sequence[CapturePlan], requests: Sequence[Any], *,
                             chunk_size: int, progress: bool = False):
        """Capture with prefix sharing and continue each ``GenerationRequest`` greedily from the cache the
        capture built (:func:`attnprobe_hooks.transformers.generate.capture_and_generate`)."""
        return capture_and_generate(model, plans, requests, chunk_size=chunk_size, progress=progress)
