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


def test_run_prepared_is_the_one_capture_path_on_a_callers_own_points(tiny_smol):
    """run_prepared (what capture_many and the counterfactual stage both call) on two trajectories that share
    their first messages, at a caller's own query points and with prefix sharing: each row equals the one an
    independent capture_many without sharing gives at the same position (within 1e-5), and the metadata
    records what the caller said (positions, layers, weights), not a mode of its own."""
    from attnprobe.capture.api import Prepared, capture_many, prepare, run_prepared
    from attnprobe.trajectory.schema import Trajectory

    head = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Who found holmium?"}]
    trajs = [Trajectory(id="a", messages=[*head, {"role": "assistant", "content": "Per Teodor Cleve, in 1878."}]),
             Trajectory(id="b", messages=[*head, {"role": "assistant", "content": "Cleve found it in Uppsala."}])]
    prepared = []
    for t in trajs:
        r = prepare(tiny_smol, t)
        prepared.append(Prepared(t, r, [r.decision]))
    run = run_prepared(tiny_smol, prepared, queries="positions", layers=[0, 2], chunk_size=512, weights="w0",
                       share_prefixes=True)
    assert run.generated == [] and run.generation_counts == []
    alone = capture_many(tiny_smol, trajs, "decision", [0, 2], share_prefixes=False, batch_size=1)
    for got, want, p in zip(run.results, alone, prepared):
        assert [q.position for q in got.queries] == [p.rendered.decision.position] == [q.position for q in want.queries]
        np.testing.assert_allclose(got.segment_attention, want.segment_attention, atol=1e-5)
        assert abs(float(got.segment_attention.sum()) - 1.0) < 1e-4  # one row: all of the query's attention
        assert (got.meta["queries_mode"], got.meta["layers_requested"], got.meta["weights_hash"]) == \
            ("positions", [0, 2], "w0")
        assert want.meta["queries_mode"] == "decision"


def test_backend_registry_refuses_to_replace_a_name():
    from attnprobe_hooks import backend

    target = backend._REGISTRY["transformers"]
    backend.register("transformers", target)  # the same target again: nothing changes
    assert backend._REGISTRY["transformers"] == target
    with pytest.raises(ValueError, match="'vllm' is already registered as 'attnprobe_hooks.vllm.backend:VllmBackend'"):
        backend.register("vllm", "somewhere.else:Backend")
    assert backend._REGISTRY["vllm"] == "attnprobe_hooks.vllm.backend:VllmBackend"
