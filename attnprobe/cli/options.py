"""Option groups shared by several commands, declared once (same names, help and defaults everywhere)."""

from __future__ import annotations

import argparse


def parse_int_list(text: str | None) -> list[int] | None:
    """'0,3,5-8' -> [0, 3, 5, 6, 7, 8]; None/'all' -> None."""
    if text is None or text == "all":
        return None
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                a, b = part.split("-", 1)
                out.extend(range(int(a), int(b) + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a list of integers or ranges: {text!r}") from None
    return out


def _queries(text: str):
    if text.startswith("positions:"):
        return parse_int_list(text.split(":", 1)[1])
    return text


def add_capture_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default",
                   help="'default' (bundled SmolLM2-135M-Instruct), a local HF folder, a .gguf file, or a cached hub id")
    p.add_argument("--backend", default="transformers", choices=["transformers", "vllm"])
    p.add_argument("--dtype", default="float32", help="float32 (exact reference), bfloat16 or float16")
    p.add_argument("--device", default="cpu", help="transformers device, e.g. cpu or cuda")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM only: tensor-parallel ranks")
    p.add_argument("--queries", default="reasoning", type=_queries,
                   help="reasoning | decision | reasoning+decision | positions:10,20,300")
    p.add_argument("--layers", default=None, type=parse_int_list, help="layers to score, e.g. '0-3,10' (default all)")
    p.add_argument("--chunk-size", type=int, default=512, help="prefill chunk size in tokens (default 512)")
    p.add_argument("--rendering", default="auto", choices=["auto", "native", "native+reasoning-in-content", "text"])
    p.add_argument("--max-tokens", type=int, default=None,
                   help="refuse longer trajectories (default: the model's max_position_embeddings)")
    p.add_argument("--truncate", action="store_true", help="truncate over-long trajectories instead of refusing")
    p.add_argument("--save-qk-layers", type=parse_int_list, default=[], help="also save q/k of these layers")


def load_for_capture(args):
    from attnprobe.capture.models import load_model

    if args.backend == "vllm":
        return load_model(args.model, backend="vllm", dtype=args.dtype,
                          tensor_parallel_size=args.tensor_parallel_size, chunk_size=args.chunk_size)
    return load_model(args.model, dtype=args.dtype, device=args.device)
