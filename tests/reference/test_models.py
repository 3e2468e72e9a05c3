"""Loading paths (bundled GGUF, local HF folder) and architectures beyond SmolLM2: GQA with
head_dim != hidden/heads, sliding windows, soft-capping and attention sinks, each vs eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.eager import eager_output_attentions, reduce_rows

import attnprobe
from attnprobe.model_files import default_gguf_path, resolve_spec
from attnprobe_hooks.scoring import score_query_rows


def test_default_is_the_bundled_gguf(smol):
    path = default_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert smol.source == "gguf" and smol.dtype == "float32" and smol.num_layers == 30
    assert next(smol.model.parameters()).dtype == torch.float32
    assert attnprobe.load_model("default") is smol  # loaded once per process
    with pytest.raises(attnprobe.ModelNotFoundError, match="no config.json"):
        resolve_spec(str(default_gguf_path().parent.parent))


def _save_random(tmp_path, smol, config, name):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    folder = tmp_path / name
    model.save_pretrained(folder)
    smol.tokenizer.save_pretrained(folder)
    return folder


def _check_vs_eager(loaded, traj, chunk):
    res = attnprobe.capture(loaded, traj, queries="reasoning+decision", chunk_size=chunk, max_tokens=4096)
    rows = eager_output_attentions(loaded.model, res.input_ids, res.query_positions)
    np.testing.assert_allclose(res.layer_head_attention, reduce_rows(rows, res.segments), atol=1e-5, rtol=0)
    return res


def test_local_hf_folder_gqa_head_dim(tmp_path, smol, samples):
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=len(smol.tokenizer), hidden_size=96, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096)
    folder = _save_random(tmp_path, smol, cfg, "llama-gqa")
    loaded = attnprobe.load_model(str(folder))
    assert loaded.source == "hf-folder" and loaded.name == "llama-gqa"
    res = _check_vs_eager(loaded, samples["sample-reasoning-1"], chunk=200)
    assert res.layer_head_attention.shape[1:3] == (2, 8)


def test_sliding_window_model(tmp_path, smol, samples):
    from transformers import MistralConfig

    cfg = MistralConfig(vocab_size=len(smol.tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=96,
                        max_position_embeddings=4096)
    folder = _save_random(tmp_path, smol, cfg, "mistral-sw")
    loaded = attnprobe.load_model(str(folder))
    res = _check_vs_eager(loaded, samples["sample-reasoning-1"], chunk=128)
    # With a 96-token window, a late query cannot see the system prompt at all.
    assert res.segment_attention[-1, 1] == 0.0 and res.segments[1].role == "system"


def test_softcap_and_sinks_in_scoring_math():
    """Against a direct numpy softmax: windows, soft-capping and per-head sink logits."""
    rng = np.random.default_rng(0)
    H, KVH, n, d, S = 4, 2, 40, 8, 5
    q = torch.tensor(rng.normal(size=(H, n, d)), dtype=torch.float32)
    k = torch.tensor(rng.normal(size=(KVH, n, d)), dtype=torch.float32)
    seg = torch.tensor(np.repeat(np.arange(S), n // S))
    qpos = torch.tensor([3, 17, 39])
    sinks = torch.tensor(rng.normal(size=H), dtype=torch.float32)
    seg_out, tok = score_query_rows(q[:, qpos], k, qpos, torch.arange(n), seg, S, 0.3, sliding_window=10,
                                    softcap=2.0, sinks=sinks)
    for i, p in enumerate(qpos.tolist()):
        for h in range(H):
            logits = (q[h, p].numpy() @ k[h // 2].numpy().T) * 0.3
            logits = np.tanh(logits / 2.0) * 2.0
            vis = (np.arange(n) <= p) & (np.arange(n) > p - 10)
            e = np.where(vis, np.exp(logits), 0.0)
            probs = e / (e.sum() + np.exp(sinks[h].item()))
            np.testing.assert_allclose(seg_out[i, h].numpy(), [probs[seg.numpy() == s].sum() for s in range(S)],
                                       atol=1e-6)
        assert tok[i].sum().item() < H  # the sink takes some mass


def test_gpt_oss_sinks_and_alternating_windows(tmp_path, smol, samples):
    from transformers import GptOssConfig

    cfg = GptOssConfig(vocab_size=len(smol.tokenizer), hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=64,
                       num_local_experts=2, num_experts_per_tok=1, max_position_embeddings=4096,
                       layer_types=["sliding_attention", "full_attention"])
    folder = _save_random(tmp_path, smol, cfg, "gptoss")
    loaded = attnprobe.load_model(str(folder), attn_implementation="eager")
    assert loaded.attn_implementation == "attnprobe_eager"
    for layer in loaded.model.base_model.layers:  # random init leaves sinks at zero: make them matter
        torch.nn.init.normal_(layer.self_attn.sinks, std=1.0)
    _check_vs_eager(loaded, samples["sample-reasoning-2"], chunk=100)
