"""GGUF -> Hugging Face folder conversion, so GGUF models (the bundled SmolLM2) run under vLLM.

vLLM loads Hugging Face folders (config.json + safetensors + tokenizer files). transformers can
read a GGUF file and dequantize it; we then drop the quantizer so ``save_pretrained`` writes plain
weights, and save the tokenizer with its chat template next to them. The result is a normal model
folder that both backends load, which is also what makes vLLM-vs-transformers reference tests
compare exactly the same weights.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from attnprobe.errors import AttnprobeError, ModelNotFoundError
from attnprobe.io import AtomicDir, load_json

MARKER = "attnprobe_convert.json"


def _sha256(path: Path, limit: int | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def default_cache_dir() -> Path:
    base = os.environ.get("ATTNPROBE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "attnprobe")
    return Path(base) / "converted"


def convert_gguf(src: str | os.PathLike, out: str | os.PathLike, *, dtype: str = "float32",
                 overwrite: bool = False) -> Path:
    """Dequantize a GGUF file (or "default" for the bundled SmolLM2) into an HF folder at ``out``.

    Writes config.json, model.safetensors, the tokenizer files (with the chat template) and
    ``attnprobe_convert.json`` (source file, its sha256, dtype). The folder is written atomically.
    """
    from attnprobe.model_files import canonical_dtype, default_gguf_path, torch_dtype

    src_path = default_gguf_path() if str(src) == "default" else Path(src).expanduser()
    if not src_path.is_file():
        raise ModelNotFoundError(f"GGUF file not found: {src_path}")
    if src_path.suffix != ".gguf":
        raise AttnprobeError(f"{src_path} is not a .gguf file")
    out = Path(out).expanduser()
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise AttnprobeError(f"{out} exists and is not empty; pass overwrite=True (--overwrite) to replace it")
    dtype = canonical_dtype(dtype)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {"gguf_file": src_path.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(str(src_path.parent), **kw)
    model = AutoModelForCausalLM.from_pretrained(str(src_path.parent), dtype=torch_dtype(dtype), **kw)
    # The weights are dequantized already; without this save_pretrained refuses (or re-quantizes).
    model.hf_quantizer = None
    for cfg in (model.config, getattr(model.config, "text_config", None)):
        if cfg is not None and hasattr(cfg, "quantization_config"):
            delattr(cfg, "quantization_config")
    if hasattr(model, "is_quantized"):
        try:
            model.is_quantized = False
        except AttributeError:
            pass
    with AtomicDir(out) as tmp:  # the folder appears whole, and a replaced one is never missing
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        if getattr(tokenizer, "chat_template", None) and not any(
                (tmp / n).is_file() for n in ("chat_template.jinja", "chat_template.json")):
            (tmp / "chat_template.jinja").write_text(tokenizer.chat_template, encoding="utf-8")
        cfg = load_json(tmp / "config.json")
        cfg.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
        (tmp / MARKER).write_text(json.dumps({
            "source": str(src_path), "source_sha256": _sha256(src_path), "dtype": dtype,
            "tool": "attnprobe convert"}, indent=1), encoding="utf-8")
    return out


def converted_folder(src: str | os.PathLike, *, dtype: str = "float32", cache_dir: str | os.PathLike | None = None,
                     progress: bool = True) -> Path:
    """The cached HF folder for a GGUF file, converting it on first use."""
    from attnprobe.model_files import canonical_dtype, default_gguf_path

    src_path = default_gguf_path() if str(src) == "default" else Path(src).expanduser()
    if not src_path.is_file():
        raise ModelNotFoundError(f"GGUF file not found: {src_path}")
    st = src_path.stat()
    key = hashlib.sha256(f"{src_path.resolve()}|{st.st_size}|{int(st.st_mtime)}|{canonical_dtype(dtype)}".encode())
    folder = Path(cache_dir or default_cache_dir()) / f"{src_path.stem}-{canonical_dtype(dtype)}-{key.hexdigest()[:12]}"
    if (folder / MARKER).is_file() and (folder / "config.json").is_file():
        return folder
    if progress:
        print(f"attnprobe: converting {src_path.name} to a Hugging Face folder for vLLM (once): {folder}",
              flush=True)
    return convert_gguf(src_path, folder, dtype=dtype, overwrite=True)
