"""capture() / capture_many(): render trajectories, run chunked prefills with the hooks, return scores.

Everything here is backend-neutral: rendering (:func:`prepare`), query selection
(:func:`select_queries`), building backend plans and assembling results (:func:`assemble`). The
backend named by ``model.backend`` (see :mod:`attnprobe_hooks.backend`) only runs the prefills and
fills one :class:`attnprobe_hooks.QueryScorer` per trajectory.
"""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnprobe._version import __version__
from attnprobe.capture.models import LoadedModel
from attnprobe.errors import AttnprobeError, TooLongError
from attnprobe.io import progress_bar
from attnprobe.render.rendering import Rendered, render
from attnprobe.render.segments import QueryPoint
from attnprobe.results.result import CaptureResult
from attnprobe.trajectory.schema import Trajectory
from attnprobe_hooks.backend import BackendOutput, CapturePlan, get_backend

log = logging.getLogger(__name__)

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
        return sorted(out, key=lambda q: q.position)  # a recorded call's decision precedes its reply's start
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
    """Keep the first ``limit`` tokens. The decision stays where it was when it is kept (a recorded call's
    decision is before its reply, :func:`attnprobe.render.rendering.decision_point`); otherwise the last
    token kept stands in for it."""
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
    if rendered.decision.position >= limit:  # the decision was cut off: the last token kept stands in for it
        rendered.decision = QueryPoint(limit - 1, "decision", last.turn, last.message_index)
    rendered.text = rendered.text[: int(rendered.offsets[-1][1])]
    return rendered


def prepare(model: LoadedModel, trajectory: Trajectory, *, rendering: str = "auto",
            max_tokens: int | None = None, truncate: bool = False) -> Rendered:
    """Render and segment with the model's tokenizer, enforcing the token limit (a text that cannot fit is
    refused before it is tokenized, unless ``truncate``)."""
    limit = max_tokens if max_tokens is not None else model.max_positions
    rendered = render(trajectory, model.tokenizer, rendering=rendering, max_tokens=None if truncate else limit)
    n = len(rendered.input_ids)
    if limit is not None and n > limit:
        if not truncate:
            src = "max_tokens" if max_tokens is not None else "the model's max_position_embeddings"
            raise TooLongError(f"trajectory {trajectory.id!r} renders to {n} tokens, above the limit of {limit} "
                               f"({src}); raise the limit (--max-tokens) or truncate (--truncate)")
        rendered = _truncate(rendered, limit)
    return rendered


def weights_hash(spec: str) -> str | None:
    """Fingerprint of the weights a model spec names (:func:`attnprobe.io.fingerprint`: config and
    tokenizer files whole, weight files by size and three 64 KiB samples); None when the spec does not
    resolve to local files. Computed from the spec, not the loaded model, so a resume can be checked
    before any model is loaded."""
    from attnprobe.io import fingerprint
    from attnprobe.model_files import resolve_spec

    try:
        source, where, gguf = resolve_spec(spec)
        if source == "gguf":
            return fingerprint(Path(where) / gguf)
        if source == "hf-folder":
            return fingerprint(Path(where))
        from huggingface_hub import snapshot_download

        return fingerprint(Path(snapshot_download(str(where), local_files_only=True)))
    except Exception:  # noqa: BLE001 - a model that cannot be found fails later, at load time, with its own message
        return None


def variant_key(model: str, dtype: str, backend: str, weights: str | None) -> str:
    """What makes two captures comparable: model name, dtype, backend and weights fingerprint.
    Results of different variants are never mixed (``attnprobe capture`` refuses to resume across them)."""
    return f"{model}/{dtype}/{backend}/{weights or 'unknown-weights'}"


@dataclass(frozen=True)
class CaptureSettings:
    """The request-side settings recorded in every result's metadata."""

    queries: str | Sequence[int]
    layers: list[int] | None  # validated and sorted, None = all
    chunk_size: int
    chunk_reason: str  # why this chunk (attnprobe_hooks.chunking.choose_chunk)
    seconds: float  # wall time of the backend run that produced the result (per trajectory in a batch)
    weights_hash: str | None = None  # see weights_hash()
    layer_selection: str | None = None  # "full" / "all" when the layers were named, not listed


LAYER_SELECTIONS = ("all", "full")


def full_attention_layers(config) -> list[int]:
    """The model's full-attention layers: seed 002 E.1 averages only these in models that mix
    sliding-window (or linear) attention with full attention ("Every fourth layer uses full attention").

    Read from the config: ``layer_types`` (transformers >= 4.5x: ``full_attention`` vs
    ``sliding_attention``/``chunked_attention``/``linear_attention``), else the older patterns
    (``sliding_window_pattern``: every n-th layer is full; Qwen2's ``use_sliding_window`` with
    ``max_window_layers``: the layers from that index on slide). A model without such a mix (all full,
    or one sliding window everywhere, as Mistral) has every layer."""
    cfg = getattr(config, "text_config", None) or config
    n = int(cfg.num_hidden_layers)
    types = getattr(cfg, "layer_types", None)
    if types:
        full = [i for i, t in enumerate(list(types)[:n]) if t == "full_attention"]
    elif getattr(cfg, "sliding_window_pattern", None):
        every = int(cfg.sliding_window_pattern)
        full = [i for i in range(n) if (i + 1) % every == 0]
    elif getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None) \
            and getattr(cfg, "max_window_layers", None) is not None:
        full = [i for i in range(n) if i < int(cfg.max_window_layers)]
    else:
        full = []
    return full if full else list(range(n))


def check_layers(model: LoadedModel, layers: Iterable[int] | str | None) -> list[int] | None:
    """Validated, sorted model layer indices to score, or None (every layer). ``layers`` may also name a
    selection: ``"all"`` (None) or ``"full"`` (:func:`full_attention_layers`, seed 002 E.1)."""
    if layers is None:
        return None
    if isinstance(layers, str):
        if layers not in LAYER_SELECTIONS:
            raise ValueError(f"layers must be a list of layer indices or one of {', '.join(LAYER_SELECTIONS)}; "
                             f"got {layers!r}")
        return None if layers == "all" else full_attention_layers(model.model.config)
    num_layers = model.num_layers
    chosen = sorted({int(x) for x in layers})
    bad = [x for x in chosen if not 0 <= x < num_layers]
    if bad:  # as ranges: '--layers 5-300000' once printed 2.3 MB listing every missing index
        raise ValueError(f"layers {int_ranges(bad)} do not exist (the model has {num_layers} layers: "
                         f"{int_ranges(range(num_layers))})")
    return chosen


def int_ranges(values: Iterable[int], most: int = 8) -> str:
    """Sorted integers as ``--layers`` writes them (``0-3,7,9-12``), at most ``most`` ranges then how many
    more, so a message about any set of values stays one short line."""
    runs: list[list[int]] = []
    for v in sorted(set(values)):
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    text = ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:most])
    return text + (f",... ({len(runs) - most} more ranges)" if len(runs) > most else "")


def make_plan(rendered: Rendered, points: Sequence[QueryPoint], layers: Sequence[int] | None,
              save_qk_layers: Iterable[int] = (), desc: str | None = None) -> CapturePlan:
    """The backend's view of one prepared trajectory."""
    return CapturePlan(
        input_ids=np.asarray(rendered.input_ids), token_segment=np.asarray(rendered.token_segment),
        num_segments=len(rendered.segments), query_positions=tuple(int(p.position) for p in points),
        layers=None if layers is None else tuple(layers), save_qk_layers=tuple(sorted({int(x) for x in save_qk_layers})),
        desc=desc)


def assemble(model: LoadedModel, trajectory: Trajectory, rendered: Rendered, points: list[QueryPoint],
             output: BackendOutput, settings: CaptureSettings) -> CaptureResult:
    """Turn one backend output into a :class:`CaptureResult` with self-describing metadata."""
    scorer, qk, info = output
    scored, lh = scorer.layer_head_tensor()
    lh_np = lh.numpy()
    n_lh = lh_np.shape[1] * lh_np.shape[2]
    queries, layers = settings.queries, settings.layers
    meta: dict[str, Any] = {
        "attnprobe_version": __version__,
        "model": model.name, "model_spec": model.spec, "model_source": model.source,
        "model_path": model.extra.get("path"), "backend": model.backend, "dtype": model.dtype,
        "device": model.extra.get("device"), "attn_implementation": model.attn_implementation,
        "chat_template_hash": rendered.template_hash, "rendering": rendered.rendering,
        "renderings_rejected": rendered.tried, "add_generation_prompt": rendered.add_generation_prompt,
        "chunk_size": settings.chunk_size, "chunk_reason": settings.chunk_reason, "layers_requested": None if layers is None else list(layers),
        "layer_selection": settings.layer_selection,
        "num_model_layers": model.num_layers, "num_heads": int(lh_np.shape[2]),
        "queries_mode": queries if isinstance(queries, str) else "positions",
        "framing": trajectory.framing, "task": trajectory.task, "labels": trajectory.labels,
        "trajectory_meta": trajectory.meta, "truncated_from": rendered.truncated_from,
        "capture_seconds": round(settings.seconds, 3), "python": platform.python_version(),
        "trajectory_hash": trajectory.content_hash(), "weights_hash": settings.weights_hash,
        "variant": variant_key(model.name, model.dtype, model.backend, settings.weights_hash),
    }
    meta.update(info)
    return CaptureResult(
        trajectory_id=trajectory.id, input_ids=rendered.input_ids, segments=rendered.segments, queries=points,
        layers=scored, segment_attention=lh_np.mean(axis=(1, 2)), layer_head_attention=lh_np,
        token_attention=(scorer.token_sum / n_lh).numpy(), meta=meta, text=rendered.text,
        offsets=rendered.offsets, qk=qk or None,
    )


@dataclass(frozen=True)
class Prepared:
    """One trajectory ready for the backend: its rendering and the query points to score
    (:func:`prepare` and :func:`select_queries`, or a caller's own, e.g. a counterfactual context)."""

    trajectory: Trajectory
    rendered: Rendered
    points: list[QueryPoint]


@dataclass
class PreparedRun:
    """What :func:`run_prepared` returns: one result per prepared trajectory, in order, and for each
    generation request its new token ids and counts (empty without requests)."""

    results: list[CaptureResult]
    generated: list = field(default_factory=list)
    generation_counts: list = field(default_factory=list)
    sharing: Any = None  # the backend's prefill counts (attnprobe_hooks.sharing.SharingStats), when it counts


def run_prepared(model: LoadedModel, prepared: Sequence[Prepared], *, queries: str | Sequence[int],
                 layers: list[int] | None, chunk_size: int | None, weights: str | None,
                 layer_selection: str | None = None, save_qk_layers: Sequence[int] = (),
                 share_prefixes: bool = False, progress: bool = False, generate: Sequence = (),
                 what: str = "capture") -> PreparedRun:
    """One backend call over ``prepared`` (the one capture path: :func:`capture_many` and the counterfactual
    stage both run through it). ``layers``: checked (:func:`check_layers`); ``queries``, ``weights`` and
    ``layer_selection`` are recorded in every result's metadata. ``generate``: generation requests
    (:class:`attnprobe_hooks.backend.GenerationRequest`) that continue from the cache the capture builds
    (``capture_and_generate``; the backend must have it); their time is not counted as capture time.
    ``capture_seconds`` is the call's wall time divided by the number of trajectories. ``chunk_size``: None
    chooses it for the device and the longest plan (:func:`attnprobe_hooks.chunking.choose_chunk`: one pass
    on a GPU when it fits, 512 on a CPU); the chunk and the reason are recorded in every result."""
    from attnprobe_hooks.chunking import choose_chunk

    backend = get_backend(model.backend)
    plans = [make_plan(p.rendered, p.points, layers, save_qk_layers, desc=p.trajectory.id) for p in prepared]
    choice = choose_chunk(model, max((p.n for p in plans), default=1),
                          max((len(p.query_positions) for p in plans), default=0), chunk_size)
    chunk_size = choice.size
    run = PreparedRun(results=[])
    t0 = time.perf_counter()
    generating = 0.0  # seconds spent generating inside the capture call (not capture time)
    if generate:
        outputs, run.generated, run.generation_counts = backend.capture_and_generate(
            model, plans, list(generate), chunk_size=chunk_size, progress=progress)
        generating = sum(c.seconds for c in run.generation_counts)
    else:
        outputs = backend.run(model, plans, chunk_size=chunk_size, progress=progress, share_prefixes=share_prefixes)
    sharing = run.sharing = getattr(outputs, "sharing", None)  # tokens in the plans vs prefilled (the prefix trie)
    if sharing is not None and len(plans) > 1:
        log.info("%s batch: %s", what, sharing.line())
    if len(outputs) != len(plans):
        raise RuntimeError(f"backend {backend.name!r} returned {len(outputs)} outputs for {len(plans)} plans")
    settings = CaptureSettings(queries=queries, layers=layers, chunk_size=chunk_size, chunk_reason=choice.reason,
                               seconds=(time.perf_counter() - t0 - generating) / max(1, len(plans)),
                               weights_hash=weights, layer_selection=layer_selection)
    run.results = [assemble(model, p.trajectory, p.rendered, p.points, out, settings)
                   for p, out in zip(prepared, outputs)]
    return run


def capture_many(model: LoadedModel, trajectories: Iterable[Trajectory], queries: str | Sequence[int] = "reasoning",
                 layers: Sequence[int] | str | None = None, *, chunk_size: int | None = None, rendering: str = "auto",
                 max_tokens: int | None = None, truncate: bool = False, save_qk_layers: Sequence[int] = (),
                 batch_size: int | None = None, progress: bool = False,
                 share_prefixes: bool = True, tally: dict | None = None) -> list[CaptureResult]:
    """Capture several trajectories; one :class:`CaptureResult` per trajectory, in order.

    Every trajectory is rendered and checked first, then handed to the backend in batches of
    ``batch_size`` (default: all at once). The vLLM backend runs a batch in one ``generate`` call
    (the requests are sliced apart inside the hooks); the transformers backend runs them one after
    the other. Results are identical to calling :func:`capture` on each. ``chunk_size`` (default None) is
    chosen per batch: one pass on a GPU when the longest trajectory fits, else the largest chunk that does;
    512 on a CPU; the chunk a vLLM engine was built with (meta.json records it and why).
    ``capture_seconds`` is the batch's wall time divided by its size.

    ``progress=True`` shows a bar over the trajectories (when there are several) and the backend's
    per-chunk prefill bar; ``tqdm.auto`` draws them as widgets in a notebook and as text on stderr
    elsewhere. ``False`` (the default, as callers such as ``attnprobe capture`` draw their own bar)
    writes nothing.

    ``share_prefixes`` (default on, as in every command: ``CaptureOptions.share_prefixes``): the backend prefills a prefix common to several trajectories of a batch once
    (transformers: one cache cropped between plans; vLLM: its prefix cache, with what a hit skips taken from
    the plan that computed it; equal to independent captures within 1e-5, docs/prefix_sharing.md).

    ``tally``: when given, its ``plan_tokens`` and ``prefilled_tokens`` grow by the backend's counts (a
    backend that does not count adds the plans' tokens to both).
    """
    chunk = None if chunk_size is None else int(chunk_size)
    if chunk is not None and chunk < 1:
        raise ValueError("chunk_size must be >= 1")
    if batch_size is not None and batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    prepared = []
    for traj in trajectories:
        rendered = prepare(model, traj, rendering=rendering, max_tokens=max_tokens, truncate=truncate)
        prepared.append(Prepared(traj, rendered, select_queries(rendered, queries)))
    chosen = check_layers(model, layers)
    size = batch_size or max(1, len(prepared))
    weights = weights_hash(model.spec)
    results: list[CaptureResult] = []
    with progress_bar(total=len(prepared), desc="capture", unit="traj", disable=not progress or len(prepared) < 2) as bar:
        for b in range(0, len(prepared), size):
            batch = prepared[b:b + size]
            run = run_prepared(model, batch, queries=queries, layers=chosen, chunk_size=chunk, weights=weights,
                               layer_selection=layers if isinstance(layers, str) else None,
                               save_qk_layers=save_qk_layers, share_prefixes=share_prefixes, progress=progress)
            results += run.results
            if tally is not None:
                plain = sum(len(p.rendered.input_ids) for p in batch)
                tally["plan_tokens"] = tally.get("plan_tokens", 0) + (run.sharing.plan_tokens if run.sharing else plain)
                tally["prefilled_tokens"] = tally.get("prefilled_tokens", 0) + (
                    run.sharing.prefilled_tokens if run.sharing else plain)
            bar.update(len(batch))
    return results


def capture(model: LoadedModel, trajectory: Trajectory, queries: str | Sequence[int] = "reasoning",
            layers: Sequence[int] | str | None = None, *, chunk_size: int | None = None, rendering: str = "auto",
            max_tokens: int | None = None, truncate: bool = False, save_qk_layers: Sequence[int] = (),
            progress: bool = False) -> CaptureResult:
    """Capture attention at the query positions of one trajectory.

    queries: "reasoning" (first token of each reasoning step), "decision" (last prompt token),
    "reasoning+decision", or a list of token positions. layers: model layer indices to score
    (default all attention layers), or ``"full"``: only the full-attention layers of a hybrid model
    (seed 002 E.1; :func:`full_attention_layers`). The forward pass is a chunked prefill with ``chunk_size``
    tokens per step (default: chosen for the device, as for :func:`capture_many`); no token is generated. (A vLLM engine's chunk is fixed when it is built; the
    metadata records the one used.) ``progress=True``: the prefill's per-chunk bar (``tqdm.auto``,
    so a widget in a notebook).
    """
    return capture_many(model, [trajectory], queries, layers, chunk_size=chunk_size, rendering=rendering,
                        max_tokens=max_tokens, truncate=truncate, save_qk_layers=save_qk_layers,
                        progress=progress)[0]
