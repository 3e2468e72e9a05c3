"""Capture in the loop against post-hoc capture (issue 40): the same study folder captured both ways, compared
call by call (tests/unit/test_loop_capture.py, the slow bundled-model test, benchmarks/loop_attention_cost.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from attnprobe.results.result import META_FILE, CaptureResult

STAMPS = ("captured", "loop_capture", "chunk_size", "chunk_reason", "capture_seconds", "attention_calls",
          "batch_rows", "sharing")  # what differs between a capture made in the loop and one made afterwards


def post_hoc_copy(study: Path, to: Path) -> Path:
    """A copy of ``study`` without its captures (what ``study attention`` would face without the loop's)."""
    shutil.copytree(study, to)
    for d in to.glob("*/capture"):
        shutil.rmtree(d)
    for f in ("attention.json", "attention.md"):
        (to / f).unlink(missing_ok=True)
    return to


def in_loop_folders(study: Path) -> list[Path]:
    return sorted(p.parent for p in study.glob("*/capture/*/" + META_FILE)
                  if json.loads(p.read_text()).get("captured") == "captured in the loop")


def compare(loop_study: Path, post_study: Path) -> dict:
    """Every capture made in the loop against the post-hoc one of the same call: the largest absolute
    difference over segment, layer-head and token scores, per query kind; and the metadata keys that differ
    besides :data:`STAMPS`."""
    worst = {"decision": 0.0, "reasoning": 0.0}
    calls, meta_diffs = 0, set()
    for folder in in_loop_folders(loop_study):
        other = post_study / folder.relative_to(loop_study)
        a, b = CaptureResult.load(folder), CaptureResult.load(other)
        assert np.array_equal(a.input_ids, b.input_ids), folder
        assert [q.to_dict() for q in a.queries] == [q.to_dict() for q in b.queries], folder
        assert list(a.layers) == list(b.layers), folder
        for k, q in enumerate(a.queries):
            kind = "decision" if q.kind == "decision" else "reasoning"
            d = max(float(np.abs(a.layer_head_attention[k] - b.layer_head_attention[k]).max()),
                    float(np.abs(a.segment_attention[k] - b.segment_attention[k]).max()),
                    float(np.abs(a.token_attention[k] - b.token_attention[k]).max()))
            worst[kind] = max(worst[kind], d)
        meta_diffs |= {k for k in set(a.meta) | set(b.meta) if a.meta.get(k) != b.meta.get(k) and k not in STAMPS}
        calls += 1
    return {"calls": calls, "max_abs_diff": worst, "meta_differs": sorted(meta_diffs)}


def numbers_close(a, b, tol: float = 1e-5, path: str = "") -> list[str]:
    """Where two JSON documents differ (numbers beyond ``tol``, anything else at all)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}/{k}: only one side" for k in set(a) ^ set(b)]
        for k in set(a) & set(b):
            out += numbers_close(a[k], b[k], tol, f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: lengths {len(a)} and {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in numbers_close(x, y, tol, f"{path}[{i}]")]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if (a != a and b != b) or abs(a - b) <= tol:
            return []
        return [f"{path}: {a} vs {b}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]
