"""capture(): render a trajectory, run one chunked prefill with the hooks, return scores.

The public entry point is backend-neutral: rendering, query selection and result assembly live
here; each backend only runs the prefill and feeds a :class:`attnprobe_hooks.QueryScorer`.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Sequence
from typing import Any

from attnprobe._version import __version__
from attnprobe.capture.models import LoadedModel
from attnprobe.errors import AttnprobeError, TooLongError
from attnprobe.render.rendering import Rendered, render
from attnprobe.render.segments import QueryPoint
from attnprobe.results.result import CaptureResult
from attnprobe.trajectory.schema import Trajectory

QUERY_MODES = ("reasoning", "decision", "reasoning+decision")


def select_queries(rendered: Rendered, queries: str | Sequence[int]) -> list[QueryPoint]:
    """Query positions for a mode name or an explicit list of token positions."""
    n = len(rendered.input_ids)
    if isinstance(queries, str):
        if queries not in QUERY_MODES:
            raise ValueError(f"queries must be one of {', '.join(QUERY_MODES)} or a list of token positions")
        out: list[QueryPoint] = []
        if "reasoning" in queries:
            out += rendered.queries_reasoning
        if "decision" in queries and rendered.decision.position not in {q.position for q in out}:
            out.append(rendered.decision)
        if not out:
            raise AttnprobeError("this trajectory has no reasoning-start tokens (no assistant message); "
                                 "use queries='decision' or explicit positions")
        return out
    seg_of = rendered.token_segment
    out = []
    for p in queries:
        p = int(p)
        if not 0 <= p < n:
            raise ValueError(f"query position {p} is outside the trajectory (0..{n - 1})")
        seg = rendered.segments[seg_of[p]]
        out.append(QueryPoint(p, "token", seg.turn, seg.message_index))
    if not out:
        raise ValueError("empty list of query positions")
    return out


def _truncate(rendered: Rendered, limit: int) -> Rendered:
    rendered.truncated_from = len(rendered.input_ids)
    keep = [s for s in rendered.segments if s.start < limit]
    from dataclasses import replace

    segs = [replace(s, end=min(s.end, limit)) for s in keep]
    rendered.segments = segs
    rendered.input_ids = rendered.input_ids[:limit]
    rendered.offsets = rendered.offsets[:limit]
    rendered.token_segment = rendered.token_segment[:limit]
    rendered.queries_reasoning = [q for q in rendered.queries_reasoning if q.position < limit]
    last = segs[-1]
    rendered.decision = QueryPoint(limit - 1, "decision", last.turn, last.message_index)
    rendered.text = rendered.text[: int(rendered.offsets[-1][1])]
    return rendered


def prepare(model: LoadedModel, trajectory: Trajectory, *, rendering: str = "auto",
            max_tokens: int | None = None, truncate: bool = False) -> Rendered:
    """Render and segment with the model's tokenizer, enforcing the token limit."""
    rendered = render(trajectory, model.tokenizer, rendering=rendering)
    limit = max_tokens if max_tokens is not None else model.max_positions
    n = len(rendered.input_ids)
    if limit is not None and n > limit:
        if not truncate:
            src = "max_tokens" if max_tokens is not None else "the model's max_position_embeddings"
            raise TooLongError(f"trajectory {trajectory.id!r} renders to {n} tokens, above the limit of {limit} "
                               f"({src}); raise the limit (--max-tokens) or truncate (--truncate)")
        rendered = _truncate(rendered, limit)
    return rendered


def capture(model: LoadedModel, trajectory: Trajectory, queries: str | Sequence[int] = "reasoning",
            layers: Sequence[int] | None = None, *, chunk_size: int = 512, rendering: str = "auto",
            max_tokens: int | None = None, truncate: bool = False, save_qk_layers: Sequence[int] = (),
            progress: bool = False) -> CaptureResult:
    """Capture attention at the query positions of one trajectory.

    queries: "reasoning" (first token of each reasoning step), "decision" (last prompt token),
    "reasoning+decision", or a list of token positions. layers: model layer indices to score
    (default all attention layers). The forward pass is a chunked prefill with ``chunk_size``
    tokens per step; no token is generated.
    """
    if chunk_size < 1:
        raise ValueError("chunk_size must be >= 1")
    rendered = prepare(model, trajectory, rendering=rendering, max_tokens=max_tokens, truncate=truncate)
    points = select_queries(rendered, queries)
    num_layers = model.num_layers
    if layers is not None:
        layers = sorted({int(x) for x in layers})
        bad = [x for x in layers if not 0 <= x < num_layers]
        if bad:
            raise ValueError(f"layers {bad} do not exist (the model has {num_layers} layers, 0..{num_layers - 1})")
    t0 = time.perf_counter()
    if model.backend == "transformers":
        from attnprobe_hooks.transformers_capture import run_capture
    elif model.backend == "vllm":
        from attnprobe_hooks.vllm_backend import run_capture  # type: ignore[no-redef]
    else:
        raise ValueError(f"unknown backend {model.backend!r}")
    scorer, qk, info = run_capture(model, rendered, points, layers, chunk_size=chunk_size,
                                   save_qk_layers=list(save_qk_layers), progress=progress,
                                   desc=trajectory.id)
    elapsed = time.perf_counter() - t0
    scored, lh = scorer.layer_head_tensor()
    lh_np = lh.numpy()
    n_lh = lh_np.shape[1] * lh_np.shape[2]
    meta: dict[str, Any] = {
        "attnprobe_version": __version__,
        "model": model.name, "model_spec": model.spec, "model_source": model.source,
        "model_path": model.extra.get("path"), "backend": model.backend, "dtype": model.dtype,
        "device": model.extra.get("device"), "attn_implementation": model.attn_implementation,
        "chat_template_hash": rendered.template_hash, "rendering": rendered.rendering,
        "renderings_rejected": rendered.tried, "add_generation_prompt": rendered.add_generation_prompt,
        "chunk_size": chunk_size, "layers_requested": None if layers is None else list(layers),
        "num_model_layers": num_layers, "num_heads": int(lh_np.shape[2]),
        "queries_mode": queries if isinstance(queries, str) else "positions",
        "framing": trajectory.framing, "task": trajectory.task, "labels": trajectory.labels,
        "trajectory_meta": trajectory.meta, "truncated_from": rendered.truncated_from,
        "capture_seconds": round(elapsed, 3), "python": platform.python_version(),
    }
    meta.update(info)
    return CaptureResult(
        trajectory_id=trajectory.id, input_ids=rendered.input_ids, segments=rendered.segments, queries=points,
        layers=scored, segment_attention=lh_np.mean(axis=(1, 2)), layer_head_attention=lh_np,
        token_attention=(scorer.token_sum / n_lh).numpy(), meta=meta, text=rendered.text,
        offsets=rendered.offsets, qk=qk or None,
    )
