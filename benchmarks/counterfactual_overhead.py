"""Counterfactual capture of one step vs a plain SDPA chunked prefill of the same two contexts.

For each length n, the shipped long trajectory is repeated until it renders past n tokens
(``capture_overhead.long_trajectory``); the step is the latest one whose context fits in n tokens and
the policy mask:5.
``counterfactual`` = :func:`attnprobe.counterfactual.run.run_batch` (render both contexts, capture
both at the decision and reasoning start, analyse, write the step folder); ``plain`` = two chunked
SDPA prefills of the same token ids with no hooks. Target: ratio <= 1.15. Peak memory is the
process's max RSS growth during the measurement (modes alternate in one process, plain first).

    python benchmarks/counterfactual_overhead.py --lengths 1024,2048,4096,8192,16384 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(model, n: int, chunk: int) -> dict:
    import torch
    from capture_overhead import long_trajectory

    from attnprobe.counterfactual.policies import mask_observations
    from attnprobe.counterfactual.run import RunOptions, build_context, choose_steps, run_batch
    from attnprobe_hooks.transformers.backend import chunked_prefill

    traj = long_trajectory(n, model)
    policy = mask_observations(5)
    # the latest step whose context (prefix + step) still fits in n tokens
    step, orig = None, None
    for s in choose_steps(traj, min_past=1):
        c = build_context(model, traj, traj.messages[: s.message_index], traj.messages[s.message_index], "o",
                          rendering="auto", max_tokens=10 ** 9)
        if len(c.rendered.input_ids) > n and step is not None:
            break
        step, orig = s, c
    i = step.message_index
    cf = build_context(model, traj, policy(traj.messages[:i]).messages, traj.messages[i], "c",
                       rendering=orig.rendered.rendering, max_tokens=10 ** 9)
    out = {"tokens_original": len(orig.rendered.input_ids), "tokens_counterfactual": len(cf.rendered.input_ids)}
    base = rss_mib()
    t0 = time.perf_counter()
    model.model.set_attn_implementation("sdpa")
    for c in (orig, cf):
        chunked_prefill(model.model, torch.as_tensor(c.rendered.input_ids), chunk)
    out["plain_seconds"] = time.perf_counter() - t0
    out["plain_rss_growth_mib"] = rss_mib() - base
    with tempfile.TemporaryDirectory() as tmp:
        base = rss_mib()
        t0 = time.perf_counter()
        run_batch(model, [step], [policy], Path(tmp), RunOptions(chunk_size=chunk, max_tokens=10 ** 9))
        out["counterfactual_seconds"] = time.perf_counter() - t0
        out["counterfactual_rss_growth_mib"] = rss_mib() - base
    out["ratio"] = out["counterfactual_seconds"] / out["plain_seconds"]
    out["peak_rss_mib"] = rss_mib()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="1024,2048,4096,8192,16384")
    ap.add_argument("--chunk-size", type=int, default=512)
    ap.add_argument("--out", default=None, help="folder for counterfactual_overhead.json")
    args = ap.parse_args()
    import torch

    import attnprobe

    model = attnprobe.load_model("default")
    rows = []
    for n in (int(x) for x in args.lengths.split(",")):
        if not rows:
            measure(model, 300, args.chunk_size)  # warm-up (first-call costs)
        r = {"target_tokens": n, **measure(model, n, args.chunk_size)}
        rows.append(r)
        print(json.dumps(r), flush=True)
    meta = {"torch_threads": torch.get_num_threads(), "chunk_size": args.chunk_size, "model": model.name}
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "counterfactual_overhead.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print("| tokens (orig / cf) | plain s | counterfactual s | ratio |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['tokens_original']} / {r['tokens_counterfactual']} | {r['plain_seconds']:.1f} | "
              f"{r['counterfactual_seconds']:.1f} | {r['ratio']:.2f} |")


if __name__ == "__main__":
    main()
