"""Model loading: the bundled default, local HF folders, GGUF files and already-cached hub ids.

Nothing is ever downloaded: a missing model fails with a message naming what is missing.
:func:`load_model` hands the actual loading to the capture backend named by ``backend`` (see
:mod:`attnprobe_hooks.backend`); backends cache loaded models per process so tests and CLI runs
load each model once. Spec resolution and the dtype table: :mod:`attnprobe.model_files`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnprobe.errors import ModelNotFoundError
from attnprobe.io.options import option, positive_int
from attnprobe.model_files import DEFAULT_NAME, DTYPES, canonical_dtype, display_name, dtype_help, resolve_spec
from attnprobe_hooks.backend import LoadedModel, applicable_options, backend_names, get_backend

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_NAME", "LoadedModel", "ModelOptions", "ModelSpec", "load_model"]


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


MODEL_HELP = ("model spec: 'default' (the bundled SmolLM2-135M-Instruct), a local Hugging Face folder, "
              "a .gguf file, or a hub id already in the local cache (nothing is downloaded)")


@dataclass(frozen=True)
class ModelOptions:
    """The "model" option group as a record (declared once: :mod:`attnprobe.io.options`): which weights,
    in which dtype, on which device, through which capture backend. :meth:`spec` is the value every
    executor and Ray replica loads."""

    model: str = option("default", flag="--model", help=MODEL_HELP)
    dtype: str = option("float32", flag="--dtype", type=canonical_dtype, choices=DTYPES, help=dtype_help())
    device: str = option("cpu", flag="--device", help="torch device for in-process models, e.g. cpu (default) or cuda")
    backend: str = option("transformers", flag="--backend", choices=backend_names(),
                          help="capture backend (default {default}; vllm: GPU, see docs/vllm.md)")
    tensor_parallel_size: int = option(1, flag="--tensor-parallel-size", type=positive_int,
                                       help="vLLM only: tensor-parallel ranks (default {default})")

    def spec(self, chunk_size: int | None = None) -> ModelSpec:
        """The :class:`ModelSpec` to load: the load options are those the capture backend takes (the
        registry says which); ``chunk_size``: the capture chunk, which a vLLM engine is built with. A
        backend name that is not a capture backend (``ibis run``'s ``--backend`` is its generator)
        captures in process with transformers."""
        backend = self.backend if self.backend in backend_names() else "transformers"
        load = applicable_options(backend, {"device": self.device, "tensor_parallel_size": self.tensor_parallel_size,
                                            "chunk_size": chunk_size})
        return ModelSpec(self.model, backend, self.dtype, {k: v for k, v in load.items() if v is not None})
