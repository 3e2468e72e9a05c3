"""Attention at the decision position, per IBIS category, layer and head.

For every item and framing we run ``attnprobe.capture(model, trajectory, queries="decision")``
(one chunked prefill of exactly the prompt the behaviour run generated from) and keep:

- the full :class:`~attnprobe.result.CaptureResult` in ``captures/<item>/<framing>/``;
- its reduction to the IBIS categories (:data:`~attnprobe.ibis.framings.CATEGORIES`): attention
  mass [C, L, H] from the decision token to each category, summed over the category's segments;
- the number of tokens of each category, so that attention per token sits beside mass. The query is
  its own segment in every framing (inside the own call it is the ``query`` argument's value), and
  its tokens are identical across the matched framings: the query gap compares the same tokens.

:func:`aggregate` stacks everything into ``attention.safetensors`` + ``attention.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe.io import atomic_write_text
from attnprobe.results.result import META_FILE, CaptureResult
from attnprobe.studies.ibis.framings import (
    CATEGORIES,
    FRAMINGS,
    IbisProtocol,
    as_protocol,
    build_framing,
    segment_categories,
)
from attnprobe.studies.ibis.items import IbisItem
from attnprobe.studies.ibis.jobs import CAPTURE_BATCH, AttentionJob
from attnprobe.studies.ibis.layout import ATTENTION_INDEX, ModelFolderLayout


def category_mass(result: CaptureResult, trajectory) -> np.ndarray:
    """[C, L, H] attention mass from the (single) decision query to each category."""
    names = CATEGORIES
    cats = segment_categories(result.segments, trajectory)
    lh = np.asarray(result.layer_head_attention[0], dtype=np.float64)  # [L, H, S]
    out = np.zeros((len(names),) + lh.shape[:2], dtype=np.float64)
    for s, cat in enumerate(cats):
        out[names.index(cat)] += lh[:, :, s]
    return out


def category_tokens(result: CaptureResult, trajectory) -> np.ndarray:
    """[C] number of prompt tokens in each category."""
    out = np.zeros(len(CATEGORIES), dtype=np.int64)
    for seg, cat in zip(result.segments, segment_categories(result.segments, trajectory)):
        out[CATEGORIES.index(cat)] += seg.end - seg.start
    return out


def run_attention(model, items: list[IbisItem], folder: Path, *, framings=FRAMINGS, chunk_size: int | None = None,
                  force: bool = False, progress: bool = True, protocol: IbisProtocol | str = "paper",
                  batch_size: int = CAPTURE_BATCH,
                  share_prefixes: bool = True) -> dict[str, int]:
    """Capture every (item, framing) not captured yet in this process (:class:`AttentionJob` on the
    local executor); resumable (a finished capture has meta.json)."""
    from attnprobe.execution.local import in_process

    job = AttentionJob(Path(folder), items, framings=framings, chunk_size=chunk_size, protocol=as_protocol(protocol),
                       force=force, batch_size=batch_size, share_prefixes=share_prefixes)
    counts = in_process(model, progress=progress).run(job)
    return {"done_before": counts["done_before"], "captured": counts["done"], "failed": counts["failed"]}


def aggregate(items: list[IbisItem], folder: Path, *, framings=FRAMINGS,
              protocol: IbisProtocol | str = "paper") -> dict[str, Any] | None:
    """Stack captured masses into attention.safetensors (+ attention.json); items missing any framing
    are left out (and listed). Returns the index, or None when nothing was captured."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    layout = ModelFolderLayout(folder)
    rows: dict[str, list] = {fr: [] for fr in framings}
    ntok: dict[str, list] = {fr: [] for fr in framings}
    kept, missing, meta0 = [], [], None
    for it in items:
        dirs = [layout.capture(it.id, fr) for fr in framings]
        if not all((d / META_FILE).is_file() for d in dirs):
            missing.append(it.id)
            continue
        for fr, d in zip(framings, dirs):
            res = CaptureResult.load(d)
            traj = build_framing(it, fr, protocol)
            if res.meta.get("ibis", {}).get("categories") != segment_categories(res.segments, traj):
                raise AttnprobeError(f"{d}: its segments do not match today's {fr} framing (captured by an older "
                                     f"attnprobe, before the query became its own segment); rerun "
                                     f"'attnprobe ibis capture --force'")
            rows[fr].append(category_mass(res, traj))
            ntok[fr].append(category_tokens(res, traj))
            meta0 = meta0 or res.meta
        kept.append(it)
    if not kept:
        return None
    arrays = {}
    for fr in framings:
        arrays[f"mass.{fr}"] = np.ascontiguousarray(np.stack(rows[fr]), dtype=np.float32)
        arrays[f"tokens.{fr}"] = np.asarray(ntok[fr], dtype=np.int32)
    L, H = arrays[f"mass.{framings[0]}"].shape[2:]
    index = {
        "format_version": 2, "framings": list(framings), "categories": list(CATEGORIES),
        "protocol": as_protocol(protocol).name,
        "items": [it.id for it in kept], "labels": [it.label for it in kept], "domains": [it.domain for it in kept],
        "missing_items": missing, "layers": meta0.get("layers", list(range(L))), "num_heads": int(H),
        "arrays": {"mass.<framing>": "[items, categories, layers, heads] float32: attention mass from the decision "
                                     "token to each category (sums over the category's segments)",
                   "tokens.<framing>": "[items, categories] int32: prompt tokens in each category (attention "
                                       "per token = mass / tokens)"},
        "model": meta0.get("model"), "backend": meta0.get("backend"), "dtype": meta0.get("dtype"),
        "chat_template_hash": meta0.get("chat_template_hash"), "chunk_size": meta0.get("chunk_size"),
        "attnprobe_version": meta0.get("attnprobe_version"),
        "renderings": {fr: CaptureResult.load(layout.capture(kept[0].id, fr)).meta.get("rendering")
                       for fr in framings},
    }
    target = layout.attention_arrays
    tmp = target.with_name(f".{target.name}.tmp")
    save_file(arrays, str(tmp))
    tmp.replace(target)
    atomic_write_text(layout.attention_index, json.dumps(index, indent=1))
    return index


def load_attention(folder: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(index, arrays) of the folder's aggregate (:meth:`ModelFolderLayout.read_attention`)."""
    layout = ModelFolderLayout(Path(folder))
    attention = layout.read_attention()
    if attention is None:
        raise AttnprobeError(f"{folder}: no {ATTENTION_INDEX} (run 'attnprobe ibis capture' first)")
    return attention
