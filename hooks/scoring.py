"""Backend-neutral online scoring: softmax rows at chosen query positions, reduced at once.

Both backends hand over post-RoPE queries for the current prefill chunk and every key seen so far.
We compute softmax(q k^T * scale) only for the requested query rows, block by block, and reduce
each row straight into per-segment sums (and a per-token mean row). No n x n matrix is ever held:
peak extra memory is ``block * heads * kv_len`` floats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from einops import rearrange

# Upper bound on floats in one block of logits (query rows x heads x keys): 32M floats = 128 MiB.
_BLOCK_FLOATS = 32 * 1024 * 1024


def score_query_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    seg_ids: torch.Tensor,
    num_segments: int,
    scale: float,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of query rows to segments, exactly as the model's softmax computes it.

    q: [H, nq, d] post-RoPE queries at absolute positions ``q_pos`` [nq].
    k: [KVH, kv, d] post-RoPE keys at absolute positions ``k_pos`` [kv] (all keys so far).
    seg_ids: [kv] segment index of each key. GQA: query head h reads KV head h // (H // KVH).
    Returns (seg [nq, H, S] float32, tok [nq, kv] float32 = sum over heads of the probabilities).
    """
    num_heads, nq, _ = q.shape
    kv_heads, kv_len, _ = k.shape
    if num_heads % kv_heads:
        raise ValueError(f"{num_heads} query heads are not a multiple of {kv_heads} KV heads")
    group = num_heads // kv_heads
    qf = q.float()
    kf = k.float()
    seg_out = torch.zeros(nq, num_heads, num_segments, dtype=torch.float32, device=q.device)
    tok_out = torch.zeros(nq, kv_len, dtype=torch.float32, device=q.device)
    block = max(1, _BLOCK_FLOATS // max(1, num_heads * kv_len))
    k_pos = k_pos.to(q.device)
    seg_ids = seg_ids.to(q.device)
    for s in range(0, nq, block):
        e = min(nq, s + block)
        qb = rearrange(qf[:, s:e], "(kvh g) n d -> kvh (g n) d", g=group)
        logits = torch.matmul(qb, kf.transpose(1, 2)) * scale  # [KVH, g*n, kv]
        logits = rearrange(logits, "kvh (g n) kv -> n (kvh g) kv", g=group)
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        qp = q_pos[s:e].to(q.device)[:, None, None]
        visible = k_pos[None, None, :] <= qp
        if sliding_window is not None:
            visible = visible & (k_pos[None, None, :] > qp - sliding_window)
        logits = logits.masked_fill(~visible, float("-inf"))
        if sinks is not None:
            sink = sinks.float().to(q.device).view(1, num_heads, 1).expand(e - s, num_heads, 1)
            probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(logits, dim=-1)
        seg_out[s:e].index_add_(2, seg_ids, probs)
        tok_out[s:e] = probs.sum(dim=1)
    return seg_out, tok_out


@dataclass
class QueryScorer:
    """Accumulates one trajectory's scores across layers and prefill chunks.

    ``seg_ids`` maps every token position to its segment; ``query_positions`` are absolute token
    positions. Each backend calls :meth:`score_layer` once per (layer, chunk); rows for queries
    outside the chunk are skipped because their keys are complete only in their own chunk.
    """

    seg_ids: torch.Tensor
    num_segments: int
    query_positions: torch.Tensor
    layers: list[int] | None = None
    per_layer: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [nq, H, S]
    token_sum: torch.Tensor | None = None  # [nq, n], summed over scored layers and heads
    heads_seen: dict[int, int] = field(default_factory=dict)

    def __post_init__(self):
        self.query_positions = torch.as_tensor(self.query_positions, dtype=torch.long)
        self.seg_ids = torch.as_tensor(self.seg_ids, dtype=torch.long)
        self.token_sum = torch.zeros(len(self.query_positions), len(self.seg_ids), dtype=torch.float32)

    def wants(self, layer: int) -> bool:
        return self.layers is None or layer in self.layers

    def score_layer(
        self,
        layer: int,
        q_chunk: torch.Tensor,
        k_all: torch.Tensor,
        chunk_start: int,
        k_positions: torch.Tensor,
        scale: float | None,
        *,
        head_offset: int = 0,
        total_heads: int | None = None,
        sliding_window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        """Score one chunk of one layer. q_chunk: [H, chunk, d]; k_all: [KVH, kv, d].

        ``head_offset``/``total_heads`` place a tensor-parallel head shard at its global heads.
        """
        if not self.wants(layer):
            return
        num_heads, chunk_len, head_dim = q_chunk.shape
        qp = self.query_positions
        sel = ((qp >= chunk_start) & (qp < chunk_start + chunk_len)).nonzero().flatten()
        total_heads = total_heads or num_heads
        if layer not in self.per_layer:
            self.per_layer[layer] = torch.zeros(len(qp), total_heads, self.num_segments, dtype=torch.float32)
        if len(sel) == 0:
            return
        local = (qp[sel] - chunk_start).to(q_chunk.device)
        scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
        seg, tok = score_query_rows(
            q_chunk[:, local], k_all, qp[sel], k_positions, self.seg_ids[k_positions.cpu()],
            self.num_segments, scale, sliding_window=sliding_window, softcap=softcap, sinks=sinks,
        )
        self.per_layer[layer][sel, head_offset:head_offset + num_heads] = seg.cpu()
        self.token_sum[sel[:, None], k_positions.cpu()[None, :]] += tok.cpu()

    def layer_head_tensor(self) -> tuple[list[int], torch.Tensor]:
        """([scored layers], [nq, L, H, S]) in layer order."""
        layers = sorted(self.per_layer)
        if not layers:
            raise RuntimeError("no attention layer was scored: did the hooks fire?")
        return layers, torch.stack([self.per_layer[li] for li in layers], dim=1)
