"""Attention at the decision position, per IBIS category, layer and head.

For every item and framing we run ``attnprobe.capture(model, trajectory, queries="decision")``
(one chunked prefill of exactly the prompt the behaviour run generated from) and keep:

- the full :class:`~attnprobe.result.CaptureResult` in ``captures/<item>/<framing>/``;
- its reduction to the IBIS categories (:data:`~attnprobe.ibis.framings.CATEGORIES`): attention
  mass [C, L, H] from the decision token to each category, summed over the category's segments;
- ``query_tokens``: the mass (mean over layers and heads) on the query string itself. In the
  agentic framing the query is only part of the own tool-call segment, so this length-matched
  number (the same tokens in every framing) complements the whole-call mass.

:func:`aggregate` stacks everything into ``attention.safetensors`` + ``attention.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe.io import atomic_write_text, run_resumable
from attnprobe.results.result import META_FILE, CaptureResult
from attnprobe.studies.ibis.framings import FRAMINGS, build_framing, categories_for, segment_categories
from attnprobe.studies.ibis.items import IbisItem


def category_mass(result: CaptureResult, trajectory, protocol: str = "paper") -> np.ndarray:
    """[C, L, H] attention mass from the (single) decision query to each category of the protocol."""
    names = categories_for(protocol)
    cats = segment_categories(result.segments, trajectory)
    lh = np.asarray(result.layer_head_attention[0], dtype=np.float64)  # [L, H, S]
    out = np.zeros((len(names),) + lh.shape[:2], dtype=np.float64)
    for s, cat in enumerate(cats):
        out[names.index(cat)] += lh[:, :, s]
    return out


def query_token_mass(result: CaptureResult, item: IbisItem, trajectory) -> float:
    """Mean-over-heads mass on the tokens of the query string (inside the call or the quoted text)."""
    cats = segment_categories(result.segments, trajectory)
    text, offsets = result.text, result.offsets
    if offsets is None:
        return float("nan")
    total = 0.0
    row = np.asarray(result.token_attention[0], dtype=np.float64)
    for seg, cat in zip(result.segments, cats):
        if cat != "query":
            continue
        s_char, e_char = int(offsets[seg.start][0]), int(offsets[seg.end - 1][1])
        pos = text.find(item.query, s_char, e_char + 1)
        if pos < 0:
            continue
        q0, q1 = pos, pos + len(item.query)
        for t in range(seg.start, seg.end):
            a, b = offsets[t]
            if a < q1 and b > q0:
                total += row[t]
    return total


def capture_dir(folder: Path, item_id: str, framing: str) -> Path:
    return Path(folder) / "captures" / item_id / framing


def run_attention(model, items: list[IbisItem], folder: Path, *, framings=FRAMINGS, chunk_size: int = 512,
                  force: bool = False, progress: bool = True, protocol: str = "paper") -> dict[str, int]:
    """Capture every (item, framing) not captured yet; resumable (a finished capture has meta.json)."""
    from attnprobe.capture.api import capture

    folder = Path(folder)

    def work(batch: list[tuple[IbisItem, str]]) -> None:
        for it, fr in batch:
            traj = build_framing(it, fr, protocol)
            res = capture(model, traj, queries="decision", chunk_size=chunk_size)
            res.meta["ibis"] = {"item_id": it.id, "framing": fr, "label": it.label, "protocol": protocol,
                                "categories": segment_categories(res.segments, traj)}
            res.save(capture_dir(folder, it.id, fr))

    counts = run_resumable(
        [(it, fr) for it in items for fr in framings], work,
        done=lambda x: not force and (capture_dir(folder, x[0].id, x[1]) / META_FILE).is_file(),
        describe=lambda x: {"item_id": x[0].id, "framing": x[1]}, errors_path=folder / "errors.jsonl",
        stage="attention", desc="ibis attention", unit="capture", progress=progress)
    return {"done_before": counts["done_before"], "captured": counts["done"], "failed": counts["failed"]}


def aggregate(items: list[IbisItem], folder: Path, *, framings=FRAMINGS, protocol: str = "paper"
              ) -> dict[str, Any] | None:
    """Stack captured masses into attention.safetensors (+ attention.json); items missing any framing
    are left out (and listed). Returns the index, or None when nothing was captured."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    rows: dict[str, list] = {fr: [] for fr in framings}
    qtok: dict[str, list] = {fr: [] for fr in framings}
    kept, missing, meta0 = [], [], None
    for it in items:
        dirs = [capture_dir(folder, it.id, fr) for fr in framings]
        if not all((d / META_FILE).is_file() for d in dirs):
            missing.append(it.id)
            continue
        for fr, d in zip(framings, dirs):
            res = CaptureResult.load(d)
            traj = build_framing(it, fr, protocol)
            rows[fr].append(category_mass(res, traj, protocol))
            qtok[fr].append(query_token_mass(res, it, traj))
            meta0 = meta0 or res.meta
        kept.append(it)
    if not kept:
        return None
    arrays = {}
    for fr in framings:
        arrays[f"mass.{fr}"] = np.ascontiguousarray(np.stack(rows[fr]), dtype=np.float32)
        arrays[f"query_tokens.{fr}"] = np.asarray(qtok[fr], dtype=np.float32)
    L, H = arrays[f"mass.{framings[0]}"].shape[2:]
    index = {
        "format_version": 1, "framings": list(framings), "categories": list(categories_for(protocol)),
        "protocol": protocol,
        "items": [it.id for it in kept], "labels": [it.label for it in kept], "domains": [it.domain for it in kept],
        "missing_items": missing, "layers": meta0.get("layers", list(range(L))), "num_heads": int(H),
        "arrays": {"mass.<framing>": "[items, categories, layers, heads] float32: attention mass from the decision "
                                     "token to each category (sums over the category's segments)",
                   "query_tokens.<framing>": "[items] float32: mass (mean over layers and heads) on the query "
                                             "string's own tokens"},
        "model": meta0.get("model"), "backend": meta0.get("backend"), "dtype": meta0.get("dtype"),
        "chat_template_hash": meta0.get("chat_template_hash"), "chunk_size": meta0.get("chunk_size"),
        "attnprobe_version": meta0.get("attnprobe_version"),
        "renderings": {fr: CaptureResult.load(capture_dir(folder, kept[0].id, fr)).meta.get("rendering")
                       for fr in framings},
    }
    tmp = folder / ".attention.safetensors.tmp"
    save_file(arrays, str(tmp))
    tmp.replace(folder / "attention.safetensors")
    atomic_write_text(folder / "attention.json", json.dumps(index, indent=1))
    return index


def load_attention(folder: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    from safetensors.numpy import load_file

    folder = Path(folder)
    idx_path = folder / "attention.json"
    if not idx_path.is_file():
        raise AttnprobeError(f"{folder}: no attention.json (run 'attnprobe ibis capture' first)")
    return json.loads(idx_path.read_text(encoding="utf-8")), load_file(str(folder / "attention.safetensors"))
