"""One vLLM engine that generates and captures, tensor parallel (TP=2 on vLLM-CPU; issue 40, item 2).

Its own module, so the engine of tests/vllm_backend/test_vllm_loop_capture.py is shut down before this one
starts: with it alive, vLLM-CPU refused the TP=2 engine ("Given number of CPU id list ['0-1'] doesn't match
local world size 2", observed 2026-12-04: the single-rank OMP binding was still in force).
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.sampling_params", reason="the vLLM backend tests need vLLM (run .ci/vllm.sh)")

from support.vllm_live import SYSTEM, compare, live_spec  # noqa: E402


def test_tensor_parallel_generation_captures_equal_post_hoc(random_llama):
    """TP=2 (a random llama, 8 heads / 2 KV heads: each rank scores 4 heads): two turns of two episodes, the
    second served from the prefix cache; the merged shards equal the transformers capture."""
    import attnprobe
    from attnprobe.generation.chat import ChatRequest
    from attnprobe.generation.vllm_chat import VllmChat

    folder = random_llama(heads=8, kv_heads=2, head_dim=32, hidden=64, layers=2)
    tm = attnprobe.load_model(str(folder), backend="transformers", dtype="float32")
    vchat = VllmChat.open(str(folder), dtype="float32", chunk_size=128, tensor_parallel_size=2, progress=False,
                          capture=True)
    try:
        assert [r["head_offset"] for r in vchat.loaded.ranks] == [0, 4]
        convs = [[{"role": "system", "content": f"Desk {k}. " + SYSTEM}, {"role": "user", "content": q}]
                 for k, q in enumerate(["Who wrote Dracula?", "Name a planet."])]
        worst = {"segment": 0.0, "token": 0.0}
        seen = []
        for _ in range(2):
            reqs = [ChatRequest(m, max_new_tokens=4, capture=live_spec(vchat, m, per_key=True)) for m in convs]
            replies = vchat.complete_batch(reqs)
            for r in replies:
                assert sorted(r.capture.scorer.per_layer) == [0, 1] and r.capture.scorer.per_layer[0].shape[1] == 8
            seen += compare(vchat, tm, reqs, replies, worst, layers=2, rendered=False)
            convs = [m + [r.as_message(), {"role": "user", "content": "Again."}] for m, r in zip(convs, replies)]
    finally:
        vchat.close()
    print("tp=2:", seen, worst)
    assert all(s["captured_in"] == "generation" for s in seen) and seen[2]["prefix_cache_hit_tokens"] > 0
