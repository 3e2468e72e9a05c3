"""Independent reference: transformers' own eager attention on the same weights, full sequence.

Two routes, both through ``attn_implementation="eager"`` (explicit softmax, no attnprobe code):
``output_attentions=True`` (all layers at once; short inputs) and per-layer forward hooks that
read the same eager attention weights and keep only the query rows (long inputs, bounded memory).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch


@contextlib.contextmanager
def eager(model):
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)


def reduce_rows(rows: np.ndarray, segments) -> np.ndarray:
    """rows [..., n] -> [..., S] summed over each segment's tokens."""
    return np.stack([rows[..., s.start:s.end].sum(-1) for s in segments], axis=-1)


def eager_output_attentions(model, input_ids, query_positions) -> np.ndarray:
    """[nq, L, H, n] query rows from ``output_attentions=True``."""
    with eager(model), torch.no_grad():
        out = model(torch.as_tensor(input_ids)[None], output_attentions=True)
    att = torch.stack([a[0] for a in out.attentions])  # [L, H, n, n]
    return att[:, :, torch.as_tensor(query_positions)].permute(2, 0, 1, 3).numpy()


def eager_hooked_rows(model, input_ids, query_positions) -> np.ndarray:
    """[nq, L, H, n] query rows read from each eager attention module's returned weights."""
    qp = torch.as_tensor(query_positions)
    rows: dict[int, torch.Tensor] = {}
    handles = []
    for i, layer in enumerate(model.base_model.layers):
        def hook(_mod, _inp, out, i=i):
            rows[i] = out[1][0][:, qp].clone()
            return (out[0], None)
        handles.append(layer.self_attn.register_forward_hook(hook))
    try:
        with eager(model), torch.no_grad():
            model.base_model(torch.as_tensor(input_ids)[None])
    finally:
        for h in handles:
            h.remove()
    return torch.stack([rows[i] for i in sorted(rows)]).permute(2, 0, 1, 3).numpy()
