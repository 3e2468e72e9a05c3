"""transformers backend, the hook: a registered attention function that scores, then delegates.

``AttentionInterface`` hands every attention call the post-RoPE query ``[b, H, q, d]`` and the key
``[b, KVH, kv, d]`` already concatenated with the cache, so during a chunked prefill each chunk sees
all earlier keys. When no capture is active the function is a plain pass-through to SDPA (or to
the model's own eager function), so installing it leaves the forward pass unchanged.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from attnprobe_hooks.scoring import QueryScorer

SDPA_NAME = "attnprobe"
EAGER_NAME = "attnprobe_eager"


@dataclass
class CaptureState:
    """What the attention function needs to know during one prefill pass."""

    scorer: QueryScorer
    chunk_start: int = 0
    qk_layers: set[int] = field(default_factory=set)
    saved_q: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    saved_k: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    calls: int = 0


_ACTIVE: contextvars.ContextVar[CaptureState | None] = contextvars.ContextVar("attnprobe_capture", default=None)


@contextlib.contextmanager
def active(state: CaptureState) -> Iterator[CaptureState]:
    token = _ACTIVE.set(state)
    try:
        yield state
    finally:
        _ACTIVE.reset(token)


def _observe(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, kwargs: dict) -> None:
    state = _ACTIVE.get()
    if state is None:
        return
    layer = getattr(module, "layer_idx", None)
    if layer is None:
        raise RuntimeError(f"{type(module).__name__} has no layer_idx; cannot attribute attention to a layer")
    if query.shape[0] != 1:
        raise RuntimeError("attnprobe captures one trajectory per forward pass (batch size 1)")
    state.calls += 1
    chunk_len = query.shape[2]
    end = state.chunk_start + chunk_len
    kv_len = key.shape[2]
    # Sliding-window caches keep only the newest keys: they are the last kv_len positions.
    k_positions = torch.arange(end - kv_len, end)
    window = kwargs.get("sliding_window")
    state.scorer.score_layer(
        layer, query[0], key[0], state.chunk_start, k_positions, kwargs.get("scaling"),
        sliding_window=window if isinstance(window, int) and window > 0 else None,
        softcap=kwargs.get("softcap"),
        sinks=kwargs.get("s_aux"),
    )
    if layer in state.qk_layers:
        state.saved_q.setdefault(layer, []).append(query[0].detach().float().cpu().clone())
        state.saved_k.setdefault(layer, []).append(key[0, :, -chunk_len:].detach().float().cpu().clone())


def _make(delegate_getter: Callable[[object], Callable]) -> Callable:
    def attention(module, query, key, value, attention_mask, **kwargs):
        _observe(module, query, key, kwargs)
        return delegate_getter(module)(module, query, key, value, attention_mask, **kwargs)

    return attention


def _sdpa(_module):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


def _eager(module):
    """The model family's own eager function (handles softcap, sinks, ... as the model expects)."""
    fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if fn is None:
        raise RuntimeError(f"{type(module).__module__} has no eager_attention_forward to delegate to")
    return fn


@functools.cache
def register() -> None:
    """Register both attnprobe attention functions with transformers (once per process)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask, sdpa_mask

    AttentionInterface.register(SDPA_NAME, _make(_sdpa))
    AttentionMaskInterface.register(SDPA_NAME, sdpa_mask)
    AttentionInterface.register(EAGER_NAME, _make(_eager))
    AttentionMaskInterface.register(EAGER_NAME, eager_mask)


def install(model: torch.nn.Module) -> str:
    """Switch a loaded transformers model to the attnprobe attention function.

    Models that were loaded with eager attention (softcap, sinks, ...) keep eager semantics.
    Returns the implementation name now in use.
    """
    register()
    current = getattr(model.config, "_attn_implementation", None) or "sdpa"
    if current in (SDPA_NAME, EAGER_NAME):
        return current
    name = EAGER_NAME if current == "eager" else SDPA_NAME
    model.set_attn_implementation(name)
    return name
