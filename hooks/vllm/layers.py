"""Which vLLM modules are softmax-attention layers, and what scoring needs to know about each.

Runs inside a worker. vLLM is imported only inside :func:`find_attention_layers` and
:func:`tp_info`, so the pure helpers (:func:`layer_index`, :func:`describe_attention`) work on any
object with the same attributes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class LayerInfo:
    """What scoring needs to know about one hooked attention layer on this rank."""

    name: str
    layer: int
    num_heads: int  # local (this rank)
    num_kv_heads: int  # local
    head_dim: int
    scale: float
    head_offset: int  # global index of this rank's first query head
    kv_head_offset: int  # global index of this rank's first KV head
    total_heads: int
    total_kv_heads: int
    kv_replica_first: bool  # this rank holds the first copy of its KV heads
    sliding_window: int | None = None
    softcap: float | None = None
    sinks: torch.Tensor | None = None
    kv_share_target: str | None = None


@dataclass
class FoundLayers:
    """Result of :func:`find_attention_layers`: hooked modules and the attention-like ones skipped."""

    modules: list[tuple[Any, LayerInfo]] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)


def layer_index(name: str) -> int:
    """Layer number of a module name such as ``model.layers.7.self_attn.attn``."""
    m = re.search(r"layers\.(\d+)\.", name + ".")
    if m:
        return int(m.group(1))
    nums = [int(x) for x in name.split(".") if x.isdigit()]
    if len(nums) != 1:
        raise RuntimeError(f"cannot tell the layer index of attention module {name!r}")
    return nums[0]


def tp_info() -> tuple[int, int]:
    """(tensor-parallel rank, world size) of this worker; (0, 1) outside an engine."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    except Exception:  # not initialised (tests of the hook logic outside an engine)
        return 0, 1


def describe_attention(name: str, module: Any, rank: int, tp: int, total_kv_heads: int | None) -> LayerInfo:
    """LayerInfo of a vLLM ``Attention`` module (local heads, global offsets, window, softcap, sinks)."""
    impl = getattr(module, "impl", None)
    h, kvh, d = int(module.num_heads), int(module.num_kv_heads), int(module.head_size)
    if h % kvh:
        raise RuntimeError(f"{name}: {h} local query heads are not a multiple of {kvh} local KV heads")
    total_heads = h * tp
    total_kv = int(total_kv_heads) if total_kv_heads else kvh * tp
    if total_heads % total_kv:
        raise RuntimeError(f"{name}: {total_heads} query heads are not a multiple of {total_kv} KV heads")
    group = total_heads // total_kv  # query heads per KV head, globally
    head_offset = rank * h
    # Global KV head of this rank's first query head. With tp > KVH vLLM replicates each KV head on
    # tp/KVH ranks (rank r holds KV head r // replicas), which is the same number.
    kv_head_offset = head_offset // group
    replicas = max(1, tp // total_kv)
    if kvh * tp != total_kv * replicas:
        raise RuntimeError(f"{name}: {kvh} local KV heads on {tp} ranks do not match {total_kv} KV heads")
    sw = getattr(module, "sliding_window", None)
    softcap = getattr(impl, "logits_soft_cap", None)
    sinks = getattr(impl, "sinks", None)
    scale = getattr(impl, "scale", None)
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    return LayerInfo(
        name=name, layer=layer_index(name), num_heads=h, num_kv_heads=kvh, head_dim=d, scale=float(scale),
        head_offset=head_offset, kv_head_offset=kv_head_offset, total_heads=total_heads,
        total_kv_heads=total_kv, kv_replica_first=(rank % replicas) == 0,
        sliding_window=int(sw) if isinstance(sw, int) and sw > 0 else None,
        softcap=float(softcap) if softcap else None, sinks=sinks if isinstance(sinks, torch.Tensor) else None,
        kv_share_target=getattr(module, "kv_sharing_target_layer_name", None),
    )


def find_attention_layers(model: torch.nn.Module, rank: int, tp: int, total_kv_heads: int | None) -> FoundLayers:
    """Every decoder softmax-attention module (vLLM's plain ``Attention``) of ``model``.

    Other attention-like layers (Mamba, linear attention, MLA, ...) are listed in ``skipped``.
    """
    from vllm.model_executor.layers.attention import Attention

    try:
        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    except ImportError:  # pragma: no cover - older vLLM
        AttentionLayerBase = ()  # type: ignore[assignment]
    try:
        from vllm.v1.attention.backend import AttentionType

        decoder = AttentionType.DECODER
    except ImportError:  # pragma: no cover
        decoder = "decoder"
    found = FoundLayers()
    for name, module in model.named_modules():
        if type(module) is Attention and getattr(module, "attn_type", decoder) == decoder:
            info = describe_attention(getattr(module, "layer_name", name) or name, module, rank, tp, total_kv_heads)
            found.modules.append((module, info))
        elif AttentionLayerBase and isinstance(module, AttentionLayerBase):
            try:
                idx = layer_index(name)
            except RuntimeError:
                idx = None
            found.skipped.append({"module": name, "layer": idx, "kind": type(module).__name__})
    return found
