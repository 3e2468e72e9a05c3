"""Layer selection: the full-attention layers of hybrid models (seed 002 E.1: "Every fourth layer uses full
attention"; only those are averaged), read from tiny random configs (nothing downloaded)."""

from __future__ import annotations

import numpy as np
import pytest

from attnprobe.capture.api import full_attention_layers


def test_full_attention_layers_from_layer_types():
    from transformers import Gemma2Config, Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3NextConfig

    # Qwen3-Next / Qwen3.5 style: linear attention with a full layer every fourth (E.1's models)
    assert full_attention_layers(Qwen3NextConfig(num_hidden_layers=8)) == [3, 7]
    # Gemma 2 alternates sliding and full; Gemma 3 has one full layer in six
    assert full_attention_layers(Gemma2Config(num_hidden_layers=4)) == [1, 3]
    assert full_attention_layers(Gemma3TextConfig(num_hidden_layers=12)) == [5, 11]
    # Qwen2 with sliding windows from max_window_layers on
    assert full_attention_layers(Qwen2Config(num_hidden_layers=4, use_sliding_window=True, sliding_window=16,
                                             max_window_layers=2)) == [0, 1]
    # no hybrid: every layer (all full, or one window everywhere as Mistral)
    assert full_attention_layers(LlamaConfig(num_hidden_layers=3)) == [0, 1, 2]
    assert full_attention_layers(MistralConfig(num_hidden_layers=2, sliding_window=96)) == [0, 1]


def test_older_config_patterns():
    from types import SimpleNamespace

    # a config from before layer_types: Gemma-3-style pattern, and Qwen2's max_window_layers
    assert full_attention_layers(SimpleNamespace(num_hidden_layers=8, sliding_window_pattern=4)) == [3, 7]
    assert full_attention_layers(SimpleNamespace(num_hidden_layers=4, use_sliding_window=True, sliding_window=8,
                                                 max_window_layers=1)) == [0]
    assert full_attention_layers(SimpleNamespace(num_hidden_layers=4, use_sliding_window=False, sliding_window=8,
                                                 max_window_layers=1)) == [0, 1, 2, 3]
    # a multimodal config: the text config's layers
    text = SimpleNamespace(num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2)
    assert full_attention_layers(SimpleNamespace(text_config=text)) == [1, 3]


def test_capture_with_layers_full_on_a_tiny_hybrid_model(smol, samples):
    """A 4-layer Gemma-2-style model built from its config: layers="full" scores exactly layers 1 and 3,
    with the same values as those layers of an all-layer capture; a bad name is refused."""
    import torch
    from transformers import AutoModelForCausalLM, Gemma2Config

    import attnprobe
    from attnprobe_hooks.backend import LoadedModel

    cfg = Gemma2Config(vocab_size=len(smol.tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=64,
                       max_position_embeddings=4096)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    loaded = LoadedModel(model=model, tokenizer=smol.tokenizer, spec="tiny-gemma2", name="tiny-gemma2",
                         backend="transformers", dtype="float32", source="hf-folder", attn_implementation="eager")
    traj = samples["sample-reasoning-1"]
    full = attnprobe.capture(loaded, traj, queries="decision", layers="full", chunk_size=256, max_tokens=4096)
    every = attnprobe.capture(loaded, traj, queries="decision", chunk_size=256, max_tokens=4096)
    assert full.layers == [1, 3] and every.layers == [0, 1, 2, 3]
    assert full.meta["layer_selection"] == "full" and full.meta["layers_requested"] == [1, 3]
    np.testing.assert_allclose(full.layer_head_attention, every.layer_head_attention[:, [1, 3]], atol=1e-6)
    # the mean over the full layers only (E.1), not over all four
    np.testing.assert_allclose(full.segment_attention, every.layer_head_attention[:, [1, 3]].mean(axis=(1, 2)),
                               atol=1e-6)
    with pytest.raises(ValueError, match="one of all, full"):
        attnprobe.capture(loaded, traj, queries="decision", layers="sliding")
