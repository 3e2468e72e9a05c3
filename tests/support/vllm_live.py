"""Helpers for the vLLM tests of capture while generating (tests/vllm_backend/test_vllm_loop_capture*.py):
the capture specs, the post-hoc plan of a recorded call and the comparison with the transformers capture."""

from __future__ import annotations

import numpy as np

TOL = 2e-5  # as tests/vllm_backend/test_vllm_smol.py: two kernels summing the same softmax rows
CHUNK = 256
SEG = 16  # the post-hoc plan's segments: 16 prompt tokens each, the whole reply one more
SYSTEM = ("You are a careful research assistant working for a library. Answer the user's question in a short "
          "sentence. When you are unsure, say so, and name the source you would check. ") * 5


def full_plan(prompt: list[int], reply: list[int], queries):
    """The post-hoc plan of a recorded call: prompt + reply, segments of SEG prompt tokens, the reply one segment."""
    from attnprobe_hooks.backend import CapturePlan

    n = len(prompt)
    seg = np.concatenate([np.arange(n) // SEG, np.full(len(reply), (n - 1) // SEG + 1)])
    return CapturePlan(input_ids=np.asarray(prompt + reply, dtype=np.int64), token_segment=seg,
                       num_segments=int(seg[-1]) + 1, query_positions=tuple(queries))


def live_in_segments(cap, plan):
    """The live capture summed into the plan's segments (per-key rows: one segment per key) and widened."""
    import torch

    n1 = len(cap.token_ids)
    seg = torch.as_tensor(plan.token_segment[:n1])
    out = {}
    for layer, arr in cap.scorer.per_layer.items():
        if arr.shape[-1] == n1:  # per-key rows
            arr = torch.zeros(*arr.shape[:-1], plan.num_segments).index_add_(-1, seg, arr)
        out[layer] = arr
    tok = torch.zeros(cap.scorer.token_sum.shape[0], plan.n)
    tok[:, :n1] = cap.scorer.token_sum
    return out, tok


def live_spec(chat, msgs, *, per_key: bool, early: bool = False):
    from attnprobe.generation.capturing import CaptureSpec

    n = len(chat.prompt(msgs).ids)
    seg = None if per_key else tuple(int(s) for s in np.concatenate([np.arange(n) // SEG, [(n - 1) // SEG + 1]]))
    return CaptureSpec(positions=((5,) if early else ()) + (n - 1,), reply_start=True, token_segment=seg,
                       num_segments=0 if per_key else (n - 1) // SEG + 2)


def compare(vchat, tm, reqs, replies, worst, layers: int = 30, rendered: bool = True) -> list[dict]:
    """Each reply's capture against the transformers backend's post-hoc capture of the recorded call (without
    ``rendered``: of the tokens the rows saw, for a random model whose replies do not re-tokenize as written)."""
    from attnprobe.render.rendering import render
    from attnprobe.trajectory.schema import Trajectory
    from attnprobe_hooks.backend import get_backend

    plans, seen = [], []
    for req, r in zip(reqs, replies):
        n = len(r.prompt.ids)
        cap = r.capture
        assert cap is not None and cap.token_ids[:n] == r.prompt.ids and len(cap.token_ids) == n + 1
        assert cap.scorer.qpos.tolist()[-2:] == [n - 1, n]
        assert sorted(cap.scorer.per_layer) == list(range(layers))
        # the recorded call as study attention renders it: the messages sent and the reply
        full = render(Trajectory(id="call", messages=[*req.messages, r.as_message()]), vchat.tokenizer,
                      add_generation_prompt=False).input_ids.tolist() if rendered else list(cap.token_ids)
        assert full[:n + 1] == cap.token_ids  # the prompt, then the reply's first token
        plans.append(full_plan(full[:n], full[n:], cap.scorer.qpos.tolist()))
        seen.append({"n": n, "prefilled": cap.prefilled, **{k: cap.info.get(k) for k in (
            "captured_in", "prefix_cache_hit_tokens", "read_prefix_cache", "followup")}})
    ref = get_backend("transformers").run(tm, plans, chunk_size=CHUNK, share_prefixes=False)
    for r, plan, o in zip(replies, plans, ref):
        per_layer, tok = live_in_segments(r.capture, plan)
        for layer, arr in o.scorer.per_layer.items():
            d = float((per_layer[layer] - arr).abs().max())
            assert d <= TOL, (layer, d)
            worst["segment"] = max(worst["segment"], d)
        lh = len(o.scorer.per_layer) * o.scorer.per_layer[0].shape[1]  # token_attention = token_sum / lh
        d = float((tok - o.scorer.token_sum).abs().max()) / lh
        assert d <= TOL, d
        worst["token"] = max(worst["token"], d)
        assert abs(float(per_layer[0][-1].sum()) - o.scorer.per_layer[0].shape[1]) < 1e-4  # whole softmax rows
    return seen
