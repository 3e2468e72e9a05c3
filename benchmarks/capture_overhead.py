"""Capture + online scoring vs a plain SDPA chunked prefill vs eager output_attentions=True.

One run measures every length (default 1k..32k tokens) on the bundled model. Each (mode, length)
runs in a fresh subprocess so that peak memory (max RSS) is its own. Eager is attempted only
while its attention tensors (layers x heads x n^2 floats) fit the memory budget.

    python benchmarks/capture_overhead.py                      # 1k..32k, chunk 512
    python benchmarks/capture_overhead.py --lengths 1024,4096 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def long_trajectory(n_tokens: int, model):
    """The shipped long research trajectory, its turns repeated until it renders past n_tokens."""
    import attnprobe

    base = attnprobe.load_trajectories(ROOT / "trajectories" / "long_research.jsonl")[0]
    head = base.messages[:2]
    body = base.messages[2:]
    msgs = list(head)
    k = 0
    while True:
        for m in body:
            m = json.loads(json.dumps(m))
            for c in m.get("tool_calls") or []:
                c["id"] = f"{c['id']}-{k}"
            if m["role"] == "tool":
                m["tool_call_id"] = f"{m['tool_call_id']}-{k}"
            msgs.append(m)
        k += 1
        traj = attnprobe.Trajectory(id=f"bench-{n_tokens}", messages=msgs, tools=base.tools)
        if len(attnprobe.prepare(model, traj, max_tokens=10 ** 9).input_ids) >= n_tokens:
            return traj


def worker(mode: str, n: int, chunk: int) -> dict:
    import resource

    import torch

    import attnprobe
    from attnprobe_hooks.transformers.backend import chunked_prefill

    model = attnprobe.load_model("default")
    traj = long_trajectory(n, model)
    rendered = attnprobe.prepare(model, traj, max_tokens=n, truncate=True)
    ids = torch.as_tensor(rendered.input_ids)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    extra = {}
    if mode == "plain":
        model.model.set_attn_implementation("sdpa")
        chunked_prefill(model.model, ids, chunk)
    elif mode == "capture":
        res = attnprobe.capture(model, traj, queries="reasoning", chunk_size=chunk, max_tokens=n, truncate=True)
        extra["queries"] = len(res.queries)
    elif mode == "eager":
        model.model.set_attn_implementation("eager")
        with torch.no_grad():
            out = model.model(ids[None], output_attentions=True)
        extra["attn_gib"] = sum(a.numel() for a in out.attentions) * 4 / 2 ** 30
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"mode": mode, "tokens": int(len(ids)), "seconds": seconds, "peak_rss_mib": peak,
            "extra_rss_mib": peak - base_rss, **extra}


def run_sub(mode, n, chunk, timeout):
    cmd = [sys.executable, __file__, "--worker", mode, "--lengths", str(n), "--chunk-size", str(chunk)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"mode": mode, "tokens": n, "error": f"timeout after {timeout}s"}
    if out.returncode != 0:
        return {"mode": mode, "tokens": n, "error": (out.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--chunk-size", type=int, default=512)
    ap.add_argument("--eager-budget-gib", type=float, default=14.0,
                    help="skip eager where layers*heads*n^2*4 bytes exceed this")
    ap.add_argument("--repeats", type=int, default=2, help="timing repeats for lengths <= 8192 (min is reported)")
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.worker:
        print(json.dumps(worker(args.worker, lengths[0], args.chunk_size)))
        return 0
    from tqdm import tqdm

    rows = []
    layers, heads = 30, 9
    for n in tqdm(lengths, desc="lengths"):
        reps = args.repeats if n <= 8192 else 1
        res = {}
        for mode in ("plain", "capture"):
            runs = [run_sub(mode, n, args.chunk_size, args.timeout) for _ in range(reps)]
            ok = [r for r in runs if "error" not in r]
            res[mode] = min(ok, key=lambda r: r["seconds"]) if ok else runs[0]
        need = layers * heads * n * n * 4 / 2 ** 30
        res["eager"] = (run_sub("eager", n, args.chunk_size, args.timeout) if need <= args.eager_budget_gib
                        else {"mode": "eager", "tokens": n, "error": f"skipped: needs ~{need:.0f} GiB"})
        rows.append(res)
        tqdm.write(json.dumps(res))
    lines = [f"Chunk size {args.chunk_size}; bundled SmolLM2-135M-Instruct, float32, CPU "
             f"({os.cpu_count()} cores). Time = best of {args.repeats} for n <= 8192, else one run.", "",
             "| tokens | plain prefill s | capture s | ratio | plain peak MiB | capture peak MiB | eager s | eager peak MiB |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        p, c, e = r["plain"], r["capture"], r["eager"]
        ratio = f"{c['seconds'] / p['seconds']:.3f}" if "seconds" in p and "seconds" in c else "n/a"
        fmt = lambda d, k, f: (f.format(d[k]) if k in d else d.get("error", "n/a"))  # noqa: E731
        lines.append(f"| {p.get('tokens')} | {fmt(p, 'seconds', '{:.1f}')} | {fmt(c, 'seconds', '{:.1f}')} | {ratio} "
                     f"| {fmt(p, 'peak_rss_mib', '{:.0f}')} | {fmt(c, 'peak_rss_mib', '{:.0f}')} "
                     f"| {fmt(e, 'seconds', '{:.1f}')} | {fmt(e, 'peak_rss_mib', '{:.0f}')} |")
    table = "\n".join(lines)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "capture_overhead.md").write_text(table + "\n")
    (out / "capture_overhead.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
