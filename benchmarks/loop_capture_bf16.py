"""How far a capture made in the loop is from a post-hoc capture of the same tokens, in bf16 and fp32 (issue 40).

The bundled model generates two turns of three chats in one left-padded batch (the second turn from each
episode's kept cache), scoring the decision and the reply start of every call in the loop. Each call's rows
are then captured post hoc (a batch-1 chunked prefill of the same tokens, :func:`run_plans`) in the same
dtype, and in float32. Prints the largest absolute difference of any per-key probability and of any
per-head segment-free row sum; results: benchmarks/results/loop_capture_bf16.json.

    python benchmarks/loop_capture_bf16.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHATS = [[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
         [{"role": "system", "content": "You are a terse assistant who answers questions about geography."},
          {"role": "user", "content": "Which river flows through Vienna, and which sea does it reach?"}],
         [{"role": "user", "content": "Name two planets."}]]


def loop_captures(loaded):
    from attnprobe.generation.capturing import CaptureSpec
    from attnprobe.generation.chat import ChatRequest
    from attnprobe.generation.transformers_chat import TransformersChat

    chat = TransformersChat(loaded, stop_at_call=False)
    conv, caps = {i: list(c) for i, c in enumerate(CHATS)}, []
    for _turn in range(2):
        reqs = [ChatRequest(m, max_new_tokens=24, episode=str(i),
                            capture=CaptureSpec(positions=(len(chat.prompt(m).ids) - 1,))) for i, m in conv.items()]
        for i, (req, rep) in enumerate(zip(reqs, chat.complete_batch(reqs))):
            caps.append(rep.capture)
            conv[i] = req.messages + [rep.as_message(), {"role": "user", "content": "Say more."}]
    return caps


def post_hoc(loaded, cap):
    from attnprobe_hooks.backend import CapturePlan
    from attnprobe_hooks.transformers.prefill import run_plans

    n = len(cap.token_ids)
    plan = CapturePlan(input_ids=np.asarray(cap.token_ids), token_segment=np.arange(n), num_segments=n,
                       query_positions=tuple(int(p) for p in cap.scorer.qpos))
    return run_plans(loaded, [plan], chunk_size=512, share_prefixes=False)[0].scorer


def rows(scorer):
    return np.stack([scorer.per_layer[li].float().numpy() for li in sorted(scorer.per_layer)], axis=1)


def main() -> int:
    from attnprobe import load_model

    out = {}
    fp32 = load_model("default", dtype="float32")
    ref = {}
    for dtype in ("float32", "bfloat16"):
        loaded = fp32 if dtype == "float32" else load_model("default", dtype=dtype)
        caps = loop_captures(loaded)
        d_same, d_fp32, sizes = 0.0, 0.0, []
        for k, cap in enumerate(caps):
            got = rows(cap.scorer)
            d_same = max(d_same, float(np.abs(got - rows(post_hoc(loaded, cap))).max()))
            key = tuple(cap.token_ids)
            if dtype == "float32":
                ref[k] = key
            d_fp32 = max(d_fp32, float(np.abs(got - rows(post_hoc(fp32, cap))).max()))
            sizes.append(len(cap.token_ids))
        out[dtype] = {"calls": len(caps), "tokens": sizes,
                      "max_abs_diff_vs_post_hoc_same_dtype": d_same,
                      "max_abs_diff_vs_post_hoc_float32_same_tokens": d_fp32}
        print(dtype, json.dumps(out[dtype]))
    path = ROOT / "benchmarks" / "results" / "loop_capture_bf16.json"
    path.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
