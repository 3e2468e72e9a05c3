"""Cross-model comparison: one row per IBIS model folder, read from its metrics.json.

The rows feed ``compare.json``/``compare.md`` (``report.compare``), the app's Models page and
``attnprobe.results.figures.ibis_compare_figure``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnprobe.errors import AttnprobeError
from attnprobe.studies.ibis.framings import FRAMINGS


def model_folders(paths: Sequence[Path]) -> list[Path]:
    """Model folders among ``paths``: a folder with metrics.json or items.jsonl, or the model folders
    (with metrics.json) directly inside a results root."""
    out = []
    for p in map(Path, paths):
        if (p / "metrics.json").is_file() or (p / "items.jsonl").is_file():
            out.append(p)
        elif p.is_dir():
            out += sorted(q for q in p.iterdir() if (q / "metrics.json").is_file())
        else:
            raise AttnprobeError(f"{p}: not a folder")
    if not out:
        raise AttnprobeError("no IBIS model folders (with metrics.json) among: " + ", ".join(map(str, paths)))
    return out


def compare_row(m: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Headline numbers of one metrics.json: accuracies, behavioural and attentional gaps with CIs."""
    b, a = m.get("behaviour", {}), m.get("attention", {})
    acc = b.get("accuracy", {})
    g = b.get("inertia_gap", {})
    fc = (b.get("forced_choice") or {}).get("inertia_gap", {})
    ag = a.get("attentional_gap", {})
    rg = a.get("by_category", {}).get("headline", {}).get("results", {})
    row = {"model": m.get("model", folder.name), "folder": str(folder), "n_items": m.get("n_items"),
           "inertia_gap": g.get("gap"), "inertia_gap_ci95": g.get("ci95"), "mcnemar_p": g.get("mcnemar_p"),
           "unparseable": b.get("unparseable_total"), "decisions": b.get("decisions_total"),
           "attentional_gap": ag.get("gap"), "attentional_gap_ci95": ag.get("ci95"),
           "results_attention_gap": rg.get("gap_agentic_minus_observer"), "results_attention_gap_ci95": rg.get("ci95"),
           "share_inertia_direction": b.get("flips", {}).get("share_inertia_direction"),
           "forced_choice_inertia_gap": fc.get("gap"), "forced_choice_inertia_gap_ci95": fc.get("ci95"),
           "forced_choice_mcnemar_p": fc.get("mcnemar_p")}
    for fr in FRAMINGS:
        for sub in ("should_research", "should_visit_page"):
            row[f"acc_{fr}_{sub}"] = acc.get(fr, {}).get(sub, {}).get("accuracy")
    return row


def compare_rows(folders: Sequence[Path]) -> list[dict[str, Any]]:
    rows = []
    for f in model_folders(folders):
        mp = f / "metrics.json"
        if not mp.is_file():
            raise AttnprobeError(f"{f}: no metrics.json (run 'attnprobe ibis report' first)")
        rows.append(compare_row(json.loads(mp.read_text(encoding="utf-8")), f))
    return rows
