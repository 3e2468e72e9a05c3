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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.attention.bias import CausalBias, causal_lower_right

from attnprobe_hooks.scoring import QueryScorer

SDPA_NAME = "attnprobe"
EAGER_NAME = "attnprobe_eager"


@dataclass
class PlanTarget:
    """One plan's accumulators: its scorer, the layers whose q/k it keeps, and how often it was scored."""

    scorer: QueryScorer
    qk_layers: set[int] = field(default_factory=set)
    saved_q: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    saved_k: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    calls: int = 0


@dataclass
class CaptureState:
    """What the attention function needs to know during one prefill pass.

    ``targets``: (plan, limit) pairs; the running chunk's rows at positions below ``limit`` belong to
    that plan too (the plan agrees with the running tokens up to there; see
    :mod:`attnprobe_hooks.sharing`). Without sharing there is one target whose limit is its length.
    """

    targets: list[tuple[PlanTarget, int]]
    chunk_start: int = 0
    calls: int = 0


_ACTIVE: contextvars.ContextVar[CaptureState | None] = contextvars.ContextVar("attnprobe_capture", default=None)


@dataclass
class StepRow:
    """One row of a batched decode step to score (capture in the loop, issue 40): row ``batch_row``'s last
    query is query ``query_index`` of ``scorer``; its own keys are the last ``keys`` columns of the batch
    (the columns before them are left padding, never keys of this row), at positions ``0 .. keys - 1``."""

    scorer: QueryScorer
    batch_row: int
    query_index: int
    keys: int


@dataclass
class StepState:
    """The rows of one batched forward to score (:func:`stepping`); ``calls`` counts attention calls seen."""

    rows: list[StepRow]
    calls: int = 0


_STEP: contextvars.ContextVar[StepState | None] = contextvars.ContextVar("attnprobe_step", default=None)


@contextlib.contextmanager
def _set(var: contextvars.ContextVar, state):
    token = var.set(state)
    try:
        yield state
    finally:
        var.reset(token)


def stepping(state: StepState):
    """Score ``state.rows`` in the forward passes run inside (a batch of any size; see :class:`StepRow`)."""
    return _set(_STEP, state)


def _observe_step(state: StepState, layer: int, query: torch.Tensor, key: torch.Tensor, kwargs: dict) -> None:
    state.calls += 1
    window = kwargs.get("sliding_window")
    window = window if isinstance(window, int) and window > 0 else None
    for r in state.rows:
        k = key[r.batch_row, :, key.shape[2] - r.keys:]
        r.scorer.score_rows(layer, query[r.batch_row, :, -1:], r.query_index, k, 0, kwargs.get("scaling"),
                            sliding_window=window, softcap=kwargs.get("softcap"), sinks=kwargs.get("s_aux"))


def active(state: CaptureState):
    """Capture into ``state`` in the forward passes run inside."""
    return _set(_ACTIVE, state)


def _observe(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, kwargs: dict) -> None:
    state = _ACTIVE.get()
    step = _STEP.get()
    if state is None and step is None:
        return
    layer = getattr(module, "layer_idx", None)
    if layer is None:
        raise RuntimeError(f"{type(module).__name__} has no layer_idx; cannot attribute attention to a layer")
    if step is not None:
        _observe_step(step, layer, query, key, kwargs)
    if state is None:
        return
    if query.shape[0] != 1:
        raise RuntimeError("attnprobe captures one trajectory per forward pass (batch size 1)")
    state.calls += 1
    start = state.chunk_start
    end = start + query.shape[2]
    kv_len = key.shape[2]
    # Sliding-window caches keep only the newest keys: they are the last kv_len positions.
    k_start = end - kv_len
    window = kwargs.get("sliding_window")
    window = window if isinstance(window, int) and window > 0 else None
    for target, limit in state.targets:
        stop = min(end, limit)  # this plan's tokens among the chunk's end at its limit
        if stop <= start:
            continue
        target.calls += 1
        cut = end - stop  # keys (and query rows) past the plan's limit are not its tokens
        q, k = query[0, :, :stop - start], key[0, :, :kv_len - cut]
        target.scorer.score_layer(
            layer, q, k, start, k_start, kwargs.get("scaling"),
            sliding_window=window, softcap=kwargs.get("softcap"), sinks=kwargs.get("s_aux"),
        )
        if layer in target.qk_layers:  # kept on the device; moved to the host once, with the scores
            target.saved_q.setdefault(layer, []).append(q.detach().clone())
            target.saved_k.setdefault(layer, []).append(k[:, start - stop:].detach().clone())


def _make(delegate_getter: Callable[[object], Callable]) -> Callable:
    def attention(module, query, key, value, attention_mask, **kwargs):
        _observe(module, query, key, kwargs)
        if isinstance(attention_mask, CausalBias):
            if kwargs.get("position_bias") is None:
                return _lower_right(module, query, key, value, attention_mask, **kwargs)
            q_len, kv_len = query.shape[2], key.shape[2]  # an additive bias needs the mask as a tensor
            attention_mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
        return delegate_getter(module)(module, query, key, value, attention_mask, **kwargs)

    return attention


def chunk_mask(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: int = 0,
               mask_function: Callable | None = None, attention_mask: torch.Tensor | None = None,
               local_size: int | None = None, allow_is_causal_skip: bool = True, **kwargs: Any) -> Any:
    """The SDPA mask of a prefill chunk that continues a cache: no [q, kv] tensor at all.

    transformers builds a boolean [q, kv] mask for every chunk after the first (its SDPA mask skip
    covers only q = kv and q = 1), and with a mask SDPA leaves the flash kernel, and on CUDA repeats
    every cached key and value for each query head of a group. A plain causal chunk at the end of its
    keys is exactly torch's lower-right causal bias, which SDPA runs in the flash kernel with no mask
    and no copy. Anything else (padding, windows, custom mask functions, a static cache whose keys run
    past the chunk) gets transformers' own mask.
    """
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    plain = mask_function is None or mask_function is causal_mask_function
    if (allow_is_causal_skip and plain and attention_mask is None and local_size is None and batch_size == 1
            and isinstance(q_offset, int) and kv_offset == 0 and 1 < q_length < kv_length
            and q_offset + q_length == kv_length):
        return causal_lower_right(q_length, kv_length)
    kw = {"mask_function": mask_function} if mask_function is not None else {}
    return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask=attention_mask,
                     local_size=local_size, allow_is_causal_skip=allow_is_causal_skip, **kw, **kwargs)


def _lower_right(module, query, key, value, bias, dropout: float = 0.0, scaling: float | None = None,
                 **_kwargs) -> tuple[torch.Tensor, None]:
    """SDPA of a chunk against its cache with the lower-right causal bias (as transformers' SDPA
    function returns it: [b, q, H, d]). GQA stays grouped (``enable_gqa``): no key is repeated."""
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=bias, dropout_p=dropout if module.training else 0.0, scale=scaling,
        enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


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
    from transformers.masking_utils import eager_mask

    AttentionInterface.register(SDPA_NAME, _make(_sdpa))
    AttentionMaskInterface.register(SDPA_NAME, chunk_mask)
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
