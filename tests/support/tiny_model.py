"""A tiny random-weight SmolLM2: the bundled model's architecture (Llama, 9 query heads over 3 KV heads of
64 dims, RoPE, tied embeddings) and its real tokenizer and chat template, with 4 layers and a 144-wide
residual stream. Renders, segments and prompts are the bundled model's token for token, so tests of
capture, sharing, batching and resume run on it in seconds; only the numbers differ. The bundled model
itself runs where its own numbers matter (tests/integration/test_baseline.py, one end-to-end test per
command, the browser)."""

from __future__ import annotations

import shutil
from pathlib import Path

TINY_LAYERS = 4


def write_tiny_smol(out: Path, *, layers: int = TINY_LAYERS, seed: int = 0) -> Path:
    """Save the tiny model as a Hugging Face folder at ``out`` (config, safetensors, tokenizer files), so
    ``attnprobe.load_model(str(out))`` and ``--model OUT`` load it the way they load any local folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from attnprobe.model_convert import converted_folder

    src = converted_folder("default", progress=False)  # the bundled GGUF's folder: its tokenizer and config
    cfg = AutoConfig.from_pretrained(str(src), local_files_only=True)
    cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size = layers, 144, 192
    # wider random weights than the 0.02 default, so attention rows are far from uniform (a token's largest
    # weight averages ~0.04 over ~1.6k keys, 40x uniform); at 0.2 the logits grow so large that float32
    # sums of near-one rows differ from eager by 2e-5, more than trained weights ever show (~1e-6)
    cfg.initializer_range = 0.1
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(src), local_files_only=True).save_pretrained(str(out))
    for name in ("chat_template.jinja", "chat_template.json"):
        if (src / name).is_file() and not (out / name).is_file():
            shutil.copy(src / name, out / name)
    return out
