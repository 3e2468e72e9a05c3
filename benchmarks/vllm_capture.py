"""vLLM capture overhead: capture time / plain vLLM prefill time, for 1k-16k tokens, in one run.

    python benchmarks/vllm_capture.py                         # bundled SmolLM2 (converted once), fp32, CPU
    python benchmarks/vllm_capture.py --model DIR --dtype bfloat16 --lengths 1024,4096

Both timings use the same engine (eager, chunked prefill, max_tokens=1; every prompt with a cache salt of
its own, so nothing is served from the prefix cache): the
plain run with the attnprobe hooks removed, the capture run with them installed and scoring the
reasoning-start tokens and the decision position of a trajectory built by repeating the turns of
the shipped long_research sample until it reaches the target length. Each cell is the best of
``--repeats`` runs. The target (DESIGN section 11 and issue 3) is capture / plain <= 1.10.
SmolLM2 allows 8192 positions; for longer runs the benchmark uses a copy of the model folder with
``max_position_embeddings`` raised (weights are linked, not copied): timing does not depend on it.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def long_trajectory(base, tokenizer, target: int):
    """Repeat base's assistant/tool turns until the rendered trajectory exceeds ``target`` tokens."""
    from attnprobe.render import rendering as render

    msgs = base.messages
    head = [m for m in msgs[:2]]
    body = msgs[2:]
    traj = copy.deepcopy(base)
    reps = 1
    while True:
        traj.messages = copy.deepcopy(head + body * reps)
        n = len(render(traj, tokenizer).input_ids)
        if n > target:
            return traj
        reps = max(reps + 1, int(reps * target / max(1, n)) + 1)


def long_context_folder(folder: Path, max_len: int, tmp: Path) -> Path:
    cfg = json.loads((folder / "config.json").read_text())
    if cfg.get("max_position_embeddings", 0) >= max_len:
        return folder
    out = tmp / (folder.name + f"-{max_len}")
    out.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        if f.name != "config.json" and not (out / f.name).exists():
            os.symlink(f.resolve(), out / f.name)
    cfg["max_position_embeddings"] = max_len
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="HF folder, .gguf, or 'default' (bundled SmolLM2)")
    ap.add_argument("--lengths", default="1024,2048,4096,8192,16384")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--chunk-size", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--kv-cache-gib", type=float, default=None)
    ap.add_argument("--json", help="also write the table as JSON here")
    args = ap.parse_args(argv)

    import attnprobe
    from attnprobe.model_files import resolve_spec
    from attnprobe_hooks.vllm import backend as vllm_backend

    lengths = [int(x) for x in args.lengths.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="attnprobe-bench-"))
    try:
        source, where, gguf = resolve_spec(args.model)
        if source == "gguf":
            from attnprobe.model_convert import converted_folder

            folder = converted_folder(Path(where) / gguf)
        else:
            folder = Path(where)
        folder = long_context_folder(folder, max(lengths) + 8, tmp)
        t0 = time.perf_counter()
        model = attnprobe.load_model(str(folder), backend="vllm", dtype=args.dtype, chunk_size=args.chunk_size,
                                     tensor_parallel_size=args.tp, kv_cache_gib=args.kv_cache_gib)
        print(f"engine ready in {time.perf_counter() - t0:.1f} s ({model.extra['device']}, {args.dtype}, "
              f"chunk {args.chunk_size}, tp {args.tp})", file=sys.stderr)
        base = attnprobe.load_trajectories(ROOT / "trajectories" / "long_research.jsonl")[0]
        llm = model.model
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)

        def plain(ids):
            t = time.perf_counter()
            # a salt of its own: prefix caching is on, and a repeat must not be served from the cache
            llm.generate([TokensPrompt(prompt_token_ids=ids, cache_salt=f"plain-{time.perf_counter_ns()}")], params,
                         use_tqdm=False)
            return time.perf_counter() - t

        def captured(traj, n):
            t = time.perf_counter()
            res = attnprobe.capture(model, traj, queries="reasoning+decision", max_tokens=n, truncate=True)
            return time.perf_counter() - t, res

        # warm-up (allocator, kernels) on the smallest length, both ways
        warm = long_trajectory(base, model.tokenizer, min(lengths))
        captured(warm, min(lengths))
        rows = []
        for n in lengths:
            traj = long_trajectory(base, model.tokenizer, n)
            rendered = attnprobe.prepare(model, traj, max_tokens=n, truncate=True)
            ids = [int(x) for x in rendered.input_ids]
            plains, caps, res = [], [], None
            for _ in range(args.repeats):  # alternate, so load drift on a shared machine hits both
                llm.collective_rpc("attnprobe_uninstall")
                plains.append(plain(ids))
                llm.collective_rpc("attnprobe_install")
                s, res = captured(traj, n)
                caps.append(s)
            plain_s, best = min(plains), min(caps)
            gen = res.meta["batch_seconds"]["generate"]
            rows.append({"tokens": len(ids), "queries": len(res.queries), "layers": len(res.layers),
                         "plain_s": round(plain_s, 3), "capture_s": round(best, 3), "ratio": round(best / plain_s, 3),
                         "hooked_generate_s": round(gen, 3), "hook_s": res.meta.get("hook_seconds")})
            print(f"  {len(ids)} tokens: plain {plain_s:.2f} s, capture {best:.2f} s", file=sys.stderr, flush=True)
        print(f"\nvLLM capture overhead ({model.name}, {args.dtype}, {model.extra['device']}, chunk {args.chunk_size}, "
              f"tp {args.tp}, vLLM {model.extra.get('vllm_version')})")
        print(f"{'tokens':>7} {'queries':>7} {'plain s':>9} {'capture s':>10} {'ratio':>6}   (hooked generate s, of which in hooks)")
        for r in rows:
            print(f"{r['tokens']:>7} {r['queries']:>7} {r['plain_s']:>9.2f} {r['capture_s']:>10.2f} {r['ratio']:>6.3f}"
                  f"   ({r['hooked_generate_s']:.2f}, {r['hook_s'] or 0:.2f})")
        worst = max(r["ratio"] for r in rows)
        print(f"worst ratio {worst:.3f} (target <= 1.10)")
        if args.json:
            Path(args.json).write_text(json.dumps({"rows": rows, "dtype": args.dtype, "model": model.name,
                                                   "chunk_size": args.chunk_size, "tp": args.tp}, indent=1))
        vllm_backend.unload(model)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
