"""Backend-neutral online scoring: softmax rows at chosen query positions, reduced at once.

Both backends hand over post-RoPE queries for the current prefill chunk and every key seen so far.
We compute softmax(q k^T * scale) only for the requested query rows, block by block, and reduce
each row straight into per-segment sums (and a per-token mean row). No n x n matrix is ever held:
peak extra memory is ``block * heads * kv_len`` floats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from einops import rearrange

# Upper bound on floats in one block of logits (query rows x heads x keys): 32M floats = 128 MiB.
_BLOCK_FLOATS = 32 * 1024 * 1024


def _rows(
    q: torch.Tensor,
    k: torch.Tensor,
    qpos: np.ndarray,
    qpos_dev: torch.Tensor,
    k0: int,
    seg_ids: torch.Tensor,
    num_segments: int,
    scale: float,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The scoring kernel: every bound is a host integer, every tensor stays on ``q``'s device.

    ``qpos``: the rows' absolute positions on the host (ascending), ``qpos_dev`` the same on the device;
    ``k0``: absolute position of ``k[:, 0]`` (keys are contiguous); ``seg_ids``: [kv] on the device.
    Nothing here reads a device value back, so a GPU stream never waits for the host: the masks are
    built on the device from the positions, the bounds from ``qpos``.
    """
    num_heads, nq, _ = q.shape
    kv_heads, kv_len, _ = k.shape
    if num_heads % kv_heads:
        raise ValueError(f"{num_heads} query heads are not a multiple of {kv_heads} KV heads")
    group = num_heads // kv_heads
    device = q.device
    seg_out = torch.empty(nq, num_heads, num_segments, dtype=torch.float32, device=device)
    tok_out = torch.zeros(nq, kv_len, dtype=torch.float32, device=device)
    block = max(1, _BLOCK_FLOATS // max(1, num_heads * kv_len))
    last = min(kv_len, int(qpos[-1]) - k0 + 1)  # keys past the last query are never visible
    kf = k[:, :last].float()  # once per call (a no-op view in float32), not once per block
    for s in range(0, nq, block):
        e = min(nq, s + block)
        p_min, p_max = int(qpos[s]), int(qpos[e - 1])
        qp = qpos_dev[s:e]
        lo = max(0, p_min - sliding_window + 1 - k0) if sliding_window is not None else 0
        hi = min(kv_len, p_max - k0 + 1)  # keys beyond the last query are masked for every row
        kb = kf[:, lo:hi]
        qb = rearrange(q[:, s:e].float(), "(kvh g) n d -> kvh (g n) d", g=group)
        logits = torch.matmul(qb, kb.transpose(1, 2))
        logits = rearrange(logits, "kvh (g n) kv -> n (kvh g) kv", g=group).mul_(scale)
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        # Causal mask: only the tail after the earliest query can be in the future of some row.
        tail = max(0, p_min + 1 - (k0 + lo))
        if tail < hi - lo:
            kpos = torch.arange(k0 + lo + tail, k0 + hi, device=device)
            future = kpos[None, :] > qp[:, None]
            logits[..., tail:].masked_fill_(future[:, None, :], float("-inf"))
        if sliding_window is not None:
            head_w = min(hi - lo, max(0, p_max - sliding_window + 1 - (k0 + lo)))
            if head_w > 0:
                kpos = torch.arange(k0 + lo, k0 + lo + head_w, device=device)
                old = kpos[None, :] <= qp[:, None] - sliding_window
                logits[..., :head_w].masked_fill_(old[:, None, :], float("-inf"))
        if sinks is not None:
            sink = sinks.to(device=device, dtype=torch.float32).view(1, num_heads, 1).expand(e - s, num_heads, 1)
            probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(logits, dim=-1)
        # Segment sums: index_add over keys on a [kv, rows] view (fast contiguous row adds).
        acc = torch.zeros(num_segments, (e - s) * num_heads, dtype=torch.float32, device=device)
        acc.index_add_(0, seg_ids[lo:hi], probs.reshape(-1, hi - lo).t())
        seg_out[s:e] = acc.t().reshape(e - s, num_heads, num_segments)
        tok_out[s:e, lo:hi] = probs.sum(dim=1)
    return seg_out, tok_out


def score_query_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    q_pos: torch.Tensor | Sequence[int],
    k_pos: torch.Tensor | int,
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
    k: [KVH, kv, d] post-RoPE keys at absolute positions ``k_pos`` (contiguous and ascending: the
    positions, or the first one as an int). seg_ids: [kv] segment index of each key. GQA: query head h
    reads KV head h // (H // KVH). Returns (seg [nq, H, S] float32, tok [nq, kv] float32 = sum over
    heads of the probabilities). Keys after the last query are never visible, so they are not even
    multiplied. A convenience entry for one call (it reads the positions on the host); a capture goes
    through :class:`QueryScorer`, which keeps them on both sides once.
    """
    qpos = np.asarray(q_pos.tolist() if isinstance(q_pos, torch.Tensor) else q_pos, dtype=np.int64)
    k0 = int(k_pos) if not isinstance(k_pos, torch.Tensor) else int(k_pos[0])
    device = q.device
    return _rows(q, k, qpos, torch.as_tensor(qpos, device=device), k0,
                 torch.as_tensor(seg_ids, dtype=torch.long).to(device), num_segments, scale,
                 sliding_window=sliding_window, softcap=softcap, sinks=sinks)


@dataclass
class QueryScorer:
    """Accumulates one trajectory's scores across layers and prefill chunks, on the model's device.

    ``seg_ids`` maps every token position to its segment; ``query_positions`` are absolute token
    positions. Each backend calls :meth:`score_layer` once per (layer, chunk); rows for queries
    outside the chunk are skipped because their keys are complete only in their own chunk.

    The sums stay where the model runs: the positions and segment ids are copied to the device once,
    the per-layer scores and the per-token row sum accumulate there, and :meth:`to_host` brings them
    back in one transfer when the capture ends. Nothing in the per-layer path reads a device value
    (no ``.item()``, ``.cpu()``, ``bool(tensor)``): on a GPU each such read stalls the stream.

    Only the methods write the fields (``score_layer``, ``init_layer``, ``place_heads``,
    ``add_token_sum``, ``score_rows``, ``to_host``); backends and callers read ``per_layer`` /
    ``token_sum`` after :meth:`to_host`.
    """

    seg_ids: torch.Tensor
    num_segments: int
    query_positions: torch.Tensor
    layers: list[int] | None = None
    per_layer: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [nq, H, S]
    token_sum: torch.Tensor | None = None  # [nq, n], summed over scored layers and heads
    # layer -> [H] how many times each global head was placed by place_heads (tensor-parallel merge)
    _coverage: dict[int, torch.Tensor] = field(default_factory=dict, init=False, repr=False)
    # device -> (query positions, segment ids) there: copied once per capture, not per layer
    _on_device: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.query_positions = torch.as_tensor(self.query_positions, dtype=torch.long).cpu()
        self.qpos = self.query_positions.numpy().copy()  # host copy: every bound is computed from it
        if len(self.qpos) and bool((self.qpos[1:] <= self.qpos[:-1]).any()):
            raise ValueError("query positions must be strictly increasing")
        self.seg_ids = torch.as_tensor(self.seg_ids, dtype=torch.long).cpu()
        self.token_sum = torch.zeros(len(self.qpos), len(self.seg_ids), dtype=torch.float32)

    def wants(self, layer: int) -> bool:
        return self.layers is None or layer in self.layers

    def query_range(self, start: int, end: int) -> tuple[int, int]:
        """Indices ``lo, hi`` of the queries at positions ``start .. end - 1`` (a host lookup)."""
        lo, hi = np.searchsorted(self.qpos, [start, end])
        return int(lo), int(hi)

    def _device(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(query positions, segment ids) on ``device``; the first call there also moves the token sum."""
        key = str(device)
        both = self._on_device.get(key)
        if both is None:
            both = self._on_device[key] = (self.query_positions.to(device), self.seg_ids.to(device))
            if self.token_sum.device != device:
                self.token_sum = self.token_sum.to(device)
        return both

    # ------------------------------------------------------------------ lifecycle
    def fresh(self) -> QueryScorer:
        """A new, empty scorer for the same trajectory, queries and layer selection."""
        return QueryScorer(seg_ids=self.seg_ids, num_segments=self.num_segments,
                           query_positions=self.query_positions, layers=self.layers)

    def to_host(self) -> QueryScorer:
        """Move every score to the CPU in one device-to-host copy (the end of a capture). Returns self."""
        names = sorted(self.per_layer)
        parts = [self.per_layer[li] for li in names] + [self.token_sum]
        if all(t.device.type == "cpu" for t in parts):
            return self
        flat = torch.cat([t.reshape(-1).to(torch.float32) for t in parts]).cpu()
        pieces = flat.split([t.numel() for t in parts])
        for li, piece, t in zip(names, pieces, parts):
            self.per_layer[li] = piece.view(t.shape)
        self.token_sum = pieces[-1].view(parts[-1].shape)
        self._on_device.clear()
        return self

    # ------------------------------------------------------------------ writing scores
    def init_layer(self, layer: int, total_heads: int, device: torch.device | None = None) -> torch.Tensor:
        """The [nq, total_heads, S] scores of ``layer``, created as zeros on first use (on ``device``).

        A layer whose chunk holds none of the queries still exists in the result (with zeros until
        a later chunk scores it).
        """
        arr = self.per_layer.get(layer)
        if arr is None:
            arr = torch.zeros(len(self.qpos), total_heads, self.num_segments, dtype=torch.float32,
                              device=device if device is not None else "cpu")
            self.per_layer[layer] = arr
        return arr

    def place_heads(self, layer: int, shard: torch.Tensor, head_offset: int, total_heads: int) -> None:
        """Put a head shard [nq, local_heads, S] (one tensor-parallel rank) at its global head offset.

        Coverage is counted per head; :meth:`check_coverage` asserts every head was placed once.
        """
        arr = self.init_layer(layer, total_heads, shard.device)
        count = int(shard.shape[1])
        cov = self._coverage.get(layer)
        if cov is None:
            cov = self._coverage[layer] = torch.zeros(total_heads, dtype=torch.long)
        arr[:, head_offset:head_offset + count] = shard
        cov[head_offset:head_offset + count] += 1

    def add_token_sum(self, shard: torch.Tensor) -> None:
        """Add a [nq, n] per-token row sum computed elsewhere (another rank's heads)."""
        self.token_sum += shard.to(self.token_sum.device)

    def check_coverage(self) -> None:
        """Raise unless every head of every placed layer was placed exactly once (driver side, on the host)."""
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
        k_start: int,
        scale: float | None,
        *,
        head_offset: int = 0,
        total_heads: int | None = None,
        sliding_window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        """Score one chunk of one layer. q_chunk: [H, chunk, d]; k_all: [KVH, kv, d], the keys at
        positions ``k_start ..`` (contiguous).

        ``head_offset``/``total_heads`` place a tensor-parallel head shard at its global heads.
        """
        if not self.wants(layer):
            return
        num_heads, chunk_len, _ = q_chunk.shape
        self.init_layer(layer, total_heads or num_heads, q_chunk.device)
        lo, hi = self.query_range(chunk_start, chunk_start + chunk_len)
        if hi == lo:
            return
        qpos_dev, _ = self._device(q_chunk.device)
        rows = q_chunk.index_select(1, qpos_dev[lo:hi] - chunk_start)
        self.score_rows(layer, rows, lo, k_all, k_start, scale, head_offset=head_offset, total_heads=total_heads,
                        sliding_window=sliding_window, softcap=softcap, sinks=sinks)

    def score_rows(
        self,
        layer: int,
        q_rows: torch.Tensor,
        lo: int,
        k_all: torch.Tensor,
        k_start: int,
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
        caching); k_all: [KVH, kv, d] at positions ``k_start .. k_start + kv - 1``, covering every key
        the rows attend to.
        """
        if not self.wants(layer):
            return
        num_heads, m, head_dim = q_rows.shape
        device = q_rows.device
        arr = self.init_layer(layer, total_heads or num_heads, device)
        if m == 0:
            return
        hi = lo + m
        k_end = k_start + int(k_all.shape[1])
        scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
        qpos_dev, seg_dev = self._device(device)
        seg, tok = _rows(q_rows, k_all, self.qpos[lo:hi], qpos_dev[lo:hi], k_start, seg_dev[k_start:k_end],
                         self.num_segments, scale, sliding_window=sliding_window, softcap=softcap, sinks=sinks)
        arr[lo:hi, head_offset:head_offset + num_heads] = seg  # both on the device: no copy to the host
        self.token_sum[lo:hi, k_start:k_end] += tok

    def layer_head_tensor(self) -> tuple[list[int], torch.Tensor]:
        """([scored layers], [nq, L, H, S]) in layer order, on the host."""
        self.to_host()
        layers = sorted(self.per_layer)
        if not layers:
            raise RuntimeError("no attention layer was scored: did the hooks fire?")
        return layers, torch.stack([self.per_layer[li] for li in layers], dim=1)
