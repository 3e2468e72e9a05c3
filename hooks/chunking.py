"""Which prefill chunk a capture runs with, and why (recorded in meta.json as ``chunk_size`` and
``chunk_reason``).

On a GPU the fastest prefill is one pass: every chunk after the first re-reads the whole cache, and a
forward pass of 512 tokens leaves most of an H200 idle (measured: 31k tokens on a Qwen2.5-7B shape take
1.09 s in one pass, 2.33 s in 512-token chunks). So on CUDA the chunk is the whole trajectory when its
prefill fits in the free memory, else the largest chunk that does. On a CPU the passes are compute
bound whatever the chunk, and 512 keeps the activations small. A chunk given by the user always wins;
a vLLM engine's chunk is fixed when the engine is built.

The memory model (:func:`estimate_bytes`) counts what a capture holds beyond the weights: the KV cache
of the whole trajectory, one growing layer's copy while the cache appends, one chunk's activations
(with a margin for the allocator), and the scorer's working set (one layer's keys in float32, a block
of logits, the per-token rows). It is an estimate with margins, not a promise: ``chunk_reason`` says
what it assumed so a user can override with ``--chunk-size``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnprobe_hooks.backend import DEFAULT_CHUNK_SIZE, LoadedModel
from attnprobe_hooks.scoring import _BLOCK_FLOATS

GIB = 1024 ** 3
# Chunks below the trajectory's length are multiples of this (tensor-core friendly, and the grid that
# prefix sharing crops on stays coarse).
STEP = 512
# Fraction of the free memory a capture plans to use, and a floor left for the allocator and kernels.
USABLE = 0.90
RESERVE = 1 * GIB
# Activations of a forward pass are counted with this margin (temporaries, allocator rounding).
ACTIVATION_MARGIN = 1.25


@dataclass(frozen=True)
class ChunkChoice:
    """The chunk a capture runs with and the one-line reason recorded beside it."""

    size: int
    reason: str


@dataclass(frozen=True)
class Shape:
    """What the memory model needs to know of a decoder (read from its config)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    sliding: bool  # some layer uses a window (its chunks keep transformers' [q, kv] mask)

    @classmethod
    def of(cls, config: Any, dtype_bytes: int) -> Shape:
        cfg = getattr(config, "text_config", None) or config
        heads = int(cfg.num_attention_heads)
        hidden = int(cfg.hidden_size)
        types = list(getattr(cfg, "layer_types", None) or [])
        sliding = any(t != "full_attention" for t in types) or bool(getattr(cfg, "sliding_window", None)
                                                                   and getattr(cfg, "use_sliding_window", True))
        return cls(layers=int(cfg.num_hidden_layers), hidden=hidden,
                   intermediate=int(getattr(cfg, "intermediate_size", None) or 4 * hidden), heads=heads,
                   kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
                   head_dim=int(getattr(cfg, "head_dim", None) or hidden // heads), dtype_bytes=dtype_bytes,
                   sliding=sliding)


def estimate_bytes(shape: Shape, n_tokens: int, chunk: int, n_queries: int) -> int:
    """Peak bytes a capture of ``n_tokens`` in chunks of ``chunk`` adds to the loaded weights."""
    e, d = shape.dtype_bytes, shape.head_dim
    kv = 2 * shape.layers * shape.kv_heads * d * n_tokens * e
    growing = 2 * shape.kv_heads * d * n_tokens * e  # the cache appends by concatenation: one layer twice
    per_token = e * (4 * shape.hidden + 3 * shape.intermediate + 2 * (shape.heads + 2 * shape.kv_heads) * d)
    activations = ACTIVATION_MARGIN * chunk * per_token
    mask = chunk * n_tokens if (shape.sliding and chunk < n_tokens) else 0  # bool [q, kv] of windowed layers
    keys32 = shape.kv_heads * d * n_tokens * 4
    logits = 3 * 4 * min(_BLOCK_FLOATS, max(1, n_queries) * shape.heads * n_tokens)
    rows = 2 * 4 * max(1, n_queries) * n_tokens
    return int(kv + growing + activations + mask + keys32 + logits + rows)


def _free_cuda_bytes(device: Any) -> int:
    import torch

    free, _total = torch.cuda.mem_get_info(device)
    # memory this process's caching allocator holds but does not use is free for the capture too
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def choose_for_memory(shape: Shape, n_tokens: int, n_queries: int, free_bytes: int) -> ChunkChoice:
    """One pass when it fits ``free_bytes`` (less a margin), else the largest multiple of ``STEP`` that does."""
    budget = max(0, int(free_bytes * USABLE) - RESERVE)
    gib = free_bytes / GIB
    whole = estimate_bytes(shape, n_tokens, n_tokens, n_queries)
    if whole <= budget:
        return ChunkChoice(n_tokens, f"one pass: {n_tokens:,} tokens fit (estimated {whole / GIB:.1f} GiB of "
                                     f"{gib:.1f} GiB free)")
    best = 0
    lo, hi = 1, max(1, (n_tokens - 1) // STEP)  # chunks STEP * [lo, hi]; the estimate grows with the chunk
    while lo <= hi:
        mid = (lo + hi) // 2
        if estimate_bytes(shape, n_tokens, mid * STEP, n_queries) <= budget:
            best, lo = mid * STEP, mid + 1
        else:
            hi = mid - 1
    if best:
        need = estimate_bytes(shape, n_tokens, best, n_queries)
        return ChunkChoice(best, f"largest chunk that fits: one pass of {n_tokens:,} tokens needs an estimated "
                                 f"{whole / GIB:.1f} GiB, {best:,}-token chunks {need / GIB:.1f} GiB of "
                                 f"{gib:.1f} GiB free")
    need = estimate_bytes(shape, n_tokens, STEP, n_queries)
    return ChunkChoice(STEP, f"smallest chunk: even {STEP}-token chunks need an estimated {need / GIB:.1f} GiB "
                             f"of {gib:.1f} GiB free (the capture may run out of memory)")


def choose_chunk(model: LoadedModel, n_tokens: int, n_queries: int = 0,
                 requested: int | None = None) -> ChunkChoice:
    """The chunk for a capture whose longest plan has ``n_tokens`` tokens and ``n_queries`` query rows."""
    if requested is not None:
        return ChunkChoice(int(requested), "given (--chunk-size)")
    fixed = model.extra.get("chunk_size")
    if fixed is not None:
        return ChunkChoice(int(fixed), "the vLLM engine's max_num_batched_tokens, fixed when the engine was built")
    device = str(model.extra.get("device") or "cpu")
    if not device.startswith("cuda"):
        return ChunkChoice(DEFAULT_CHUNK_SIZE, f"the default on {device.split(':')[0]} ({DEFAULT_CHUNK_SIZE} tokens)")
    import torch

    shape = Shape.of(model.model.config, torch.finfo(next(model.model.parameters()).dtype).bits // 8)
    return choose_for_memory(shape, max(1, n_tokens), n_queries, _free_cuda_bytes(device))
