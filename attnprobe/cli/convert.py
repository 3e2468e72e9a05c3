"""``attnprobe convert``: GGUF file -> Hugging Face model folder (what vLLM loads)."""

from __future__ import annotations

import argparse
import sys

from attnprobe.cli.options import add_dtype_option, add_hidden_alias, add_output_options
from attnprobe.model_files import dtype_help


def _convert(args: argparse.Namespace) -> int:
    from pathlib import Path

    from attnprobe.errors import AttnprobeError
    from attnprobe.io import ensure_writable_dir
    from attnprobe.model_convert import convert_gguf

    target = Path(args.out).expanduser()
    if target.exists() and not target.is_dir():
        raise AttnprobeError(f"{target}: the output folder is a file, not a folder")
    ensure_writable_dir(target.parent, "folder of the output")  # before minutes of dequantizing
    out = convert_gguf(args.source, args.out, dtype=args.dtype, overwrite=args.force)
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
    p.add_argument("out", help="output folder (created; must be empty unless --force)")
    add_dtype_option(p.add_argument_group("model"),
                     help="dtype of the saved weights: " + dtype_help(why="the exact dequantized values"))
    add_output_options(p, out=False, progress=False,
                       force_help="replace an existing non-empty output folder (old name: --overwrite)")
    add_hidden_alias(p, "--overwrite", "force", new="--force", action="store_true")
    p.set_defaults(func=_convert)
