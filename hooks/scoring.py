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

    q: [H, nq, d] post-RoPE queries at absolute positions ``q_pos`` [nq] (ascending).
    k: [KVH, kv, d] post-RoPE keys at absolute positions ``k_pos`` [kv] (ascending, contiguous).
    seg_ids: [kv] segment index of each key. GQA: query head h reads KV head h // (H // KVH).
    Returns (seg [nq, H, S] float32, tok [nq, kv] float32 = sum over heads of the probabilities).
    Keys after the last query are never visible, so they are not even multiplied.
    """
    num_heads, nq, _ = q.shape
    kv_heads, kv_len, _ = k.shape
    if num_heads % kv_heads:
        raise ValueError(f"{num_heads} query heads are not a multiple of {kv_heads} KV heads")
    group = num_heads // kv_heads
    device = q.device
    k0 = int(k_pos[0])
    seg_out = torch.empty(nq, num_heads, num_segments, dtype=torch.float32, device=device)
    tok_out = torch.zeros(nq, kv_len, dtype=torch.float32, device=device)
    block = max(1, _BLOCK_FLOATS // max(1, num_heads * kv_len))
    seg_ids = seg_ids.to(device)
    for s in range(0, nq, block):
        e = min(nq, s + block)
        qp = q_pos[s:e].to(device)
        p_min, p_max = int(qp.min()), int(qp.max())
        lo = 0
        if sliding_window is not None:
            lo = max(0, p_min - sliding_window + 1 - k0)
        hi = min(kv_len, p_max - k0 + 1)  # keys beyond the last query are masked for every row
        kb = k[:, lo:hi].float()
        qb = rearrange(q[:, s:e].float(), "(kvh g) n d -> kvh (g n) d", g=group)
        logits = torch.matmul(qb, kb.transpose(1, 2))
        logits = rearrange(logits, "kvh (g n) kv -> n (kvh g) kv", g=group).mul_(scale)
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        kpos = k_pos[lo:hi].to(device)
        # Causal mask: only the tail after the earliest query can be in the future of some row.
        tail = max(0, p_min + 1 - (k0 + lo))
        if tail < hi - lo:
            future = kpos[None, tail:] > qp[:, None]
            logits[..., tail:].masked_fill_(future[:, None, :], float("-inf"))
        if sliding_window is not None:
            head_w = min(hi - lo, max(0, p_max - sliding_window + 1 - (k0 + lo)))
            if head_w > 0:
                old = kpos[None, :head_w] <= qp[:, None] - sliding_window
                logits[..., :head_w].masked_fill_(old[:, None, :], float("-inf"))
        if sinks is not None:
            sink = sinks.float().to(device).view(1, num_heads, 1).expand(e - s, num_heads, 1)
            probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(logits, dim=-1)
        # Segment sums: index_add over keys on a [kv, rows] view (fast contiguous row adds).
        acc = torch.zeros(num_segments, (e - s) * num_heads, dtype=torch.float32, device=device)
        acc.index_add_(0, seg_ids[lo:hi], probs.reshape(-1, hi - lo).t())
        seg_out[s:e] = acc.t().reshape(e - s, num_heads, num_segments)
        tok_out[s:e, lo:hi] = probs.sum(dim=1)
    return seg_out, tok_out


@dataclass
class QueryScorer:
    """Accumulates one trajectory's scores across layers and prefill chunks.

    ``seg_ids`` maps every token position to its segment; ``query_positions`` are absolute token
    positions. Each backend calls :meth:`score_layer` once per (layer, chunk); rows for queries
    outside the chunk are skipped because their keys are complete only in their own chunk.

    Only the methods write the fields (``score_layer``, ``init_layer``, ``place_heads``,
    ``add_token_sum``, ``score_rows``); backends and callers read ``per_layer`` / ``token_sum``.
    """

    seg_ids: torch.Tensor
    num_segments: int
    query_positions: torch.Tensor
    layers: list[int] | None = None
    per_layer: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [nq, H, S]
    token_sum: torch.Tensor | None = None  # [nq, n], summed over scored layers and heads
    # layer -> [H] how many times each global head was placed by place_heads (tensor-parallel merge)
    _coverage: dict[int, torch.Tensor] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.query_positions = torch.as_tensor(self.query_positions, dtype=torch.long)
        if len(self.query_positions) and bool((self.query_positions[1:] <= self.query_positions[:-1]).any()):
            raise ValueError("query positions must be strictly increasing")
        self.seg_ids = torch.as_tensor(self.seg_ids, dtype=torch.long)
        self.token_sum = torch.zeros(len(self.query_positions), len(self.seg_ids), dtype=torch.float32)

    def wants(self, layer: int) -> bool:
        return self.layers is None or layer in self.layers

    # ------------------------------------------------------------------ lifecycle
    def fresh(self) -> QueryScorer:
        """A new, empty scorer for the same trajectory, queries and layer selection."""
        return QueryScorer(seg_ids=self.seg_ids, num_segments=self.num_segments,
                           query_positions=self.query_positions, layers=self.layers)

    # ------------------------------------------------------------------ writing scores
    def init_layer(self, layer: int, total_heads: int) -> torch.Tensor:
        """The [nq, total_heads, S] scores of ``layer``, created as zeros on first use.

        A layer whose chunk holds none of the queries still exists in the result (with zeros until
        a later chunk scores it).
        """
        arr = self.per_layer.get(layer)
        if arr is None:
            arr = torch.zeros(len(self.query_positions), total_heads, self.num_segments, dtype=torch.float32)
            self.per_layer[layer] = arr
        return arr

    def place_heads(self, layer: int, shard: torch.Tensor, head_offset: int, total_heads: int) -> None:
        """Put a head shard [nq, local_heads, S] (one tensor-parallel rank) at its global head offset.

        Coverage is counted per head; :meth:`check_coverage` asserts every head was placed once.
        """
        arr = self.init_layer(layer, total_heads)
        count = int(shard.shape[1])
        cov = self._coverage.get(layer)
        if cov is None:
            cov = self._coverage[layer] = torch.zeros(total_heads, dtype=torch.long)
        arr[:, head_offset:head_offset + count] = shard
        cov[head_offset:head_offset + count] += 1

    def add_token_sum(self, shard: torch.Tensor) -> None:
        """Add a [nq, n] per-token row sum computed elsewhere (another rank's heads)."""
        self.token_sum += shard

    def check_coverage(self) -> None:
        """Raise unless every head of every placed layer was placed exactly once."""
        for layer, cov in self._coverage.items():
            if not bool((cov == 1).all()):
                raise RuntimeError(f"layer {layer}: heads were scored {cov.tolist()} times across ranks "
                                   "(expected once)")

    # ------------------------------------------------------------------ reading scores
    def head_shard(self, layer: int, head_offset: int, count: int) -> torch.Tensor:
        """[nq, count, S] scores of heads ``head_offset .. head_offset + count - 1`` of ``layer``."""
        return self.per_layer[layer][:, head_offset:head_offset + count].contiguous()

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
        num_heads, chunk_len, _ = q_chunk.shape
        qp = self.query_positions
        sel = ((qp >= chunk_start) & (qp < chunk_start + chunk_len)).nonzero().flatten()
        self.init_layer(layer, total_heads or num_heads)
        if len(sel) == 0:
            return
        lo, hi = int(sel[0]), int(sel[-1]) + 1  # query positions are sorted, so sel is a contiguous range
        local = qp[lo:hi] - chunk_start
        self.score_rows(layer, q_chunk.index_select(1, local.to(q_chunk.device)), lo, k_all, k_positions, scale,
                        head_offset=head_offset, total_heads=total_heads, sliding_window=sliding_window,
                        softcap=softcap, sinks=sinks)

    def score_rows(
        self,
        layer: int,
        q_rows: torch.Tensor,
        lo: int,
        k_all: torch.Tensor,
        k_positions: torch.Tensor,
        scale: float | None,
        *,
        head_offset: int = 0,
        total_heads: int | None = None,
        sliding_window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        """Score the rows of queries ``lo .. lo + m - 1`` (indices into ``query_positions``) of one layer.

        q_rows: [H, m, d], the query vectors at those positions, however they were obtained (the
        chunk that computed them, or a row another plan with the same prefix computed: vLLM prefix
        caching); k_all: [KVH, kv, d] at ``k_positions``, covering every key the rows attend to.
        """
        if not self.wants(layer):
            return
        num_heads, m, head_dim = q_rows.shape
        self.init_layer(layer, total_heads or num_heads)
        if m == 0:
            return
        hi = lo + m
        k0, k1 = int(k_positions[0]), int(k_positions[-1]) + 1
        scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
        seg, tok = score_query_rows(
            q_rows, k_all, self.query_positions[lo:hi], k_positions, self.seg_ids[k0:k1],
            self.num_segments, scale, sliding_window=sliding_window, softcap=softcap, sinks=sinks,
        )
        self.per_layer[layer][lo:hi, head_offset:head_offset + num_heads] = seg.cpu()
        self.token_sum[lo:hi, k0:k1] += tok.cpu()

    def layer_head_tensor(self) -> tuple[list[int], torch.Tensor]:
        """([scored layers], [nq, L, H, S]) in layer order."""
        layers = sorted(self.per_layer)
        if not layers:
            raise RuntimeError("no attention layer was scored: did the hooks fire?")
        return layers, torch.stack([self.per_layer[li] for li in layers], dim=1)
