"""``attnprobe convert``: GGUF file -> Hugging Face model folder (what vLLM loads)."""

from __future__ import annotations

import argparse
import sys


def _convert(args: argparse.Namespace) -> int:
    from attnprobe.capture.convert import convert_gguf

    out = convert_gguf(args.source, args.out, dtype=args.dtype, overwrite=args.overwrite)
    print(f"wrote {out} (config.json, model.safetensors, tokenizer with chat template); "
          f"use it with: attnprobe capture --backend vllm --model {out}", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "convert",
        help="convert a GGUF model (or the bundled default) to a Hugging Face folder for vLLM",
        description=(
            "Dequantize a GGUF file with transformers and save it as a Hugging Face model folder "
            "(config.json, model.safetensors, tokenizer files with the chat template). vLLM loads such "
            "folders; the vLLM backend also converts GGUF specs automatically into a cache folder "
            "(~/.cache/attnprobe/converted, or $ATTNPROBE_CACHE/converted). Nothing is downloaded."),
    )
    p.add_argument("source", help="path to a .gguf file, or 'default' for the bundled SmolLM2-135M-Instruct")
    p.add_argument("out", help="output folder (created; must be empty unless --overwrite)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="dtype of the saved weights (default float32: exact dequantized values)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing non-empty output folder")
    p.set_defaults(func=_convert)
