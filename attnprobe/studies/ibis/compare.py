"""Cross-model comparison: one row per IBIS model folder, read from its metrics.json.

The rows feed ``compare.json``/``compare.md`` (``report.compare``), the app's Models page and
``attnprobe.results.figures.ibis_compare_figure``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnprobe.errors import AttnprobeError
from attnprobe.studies.ibis.framings import FRAMINGS
from attnprobe.studies.ibis.layout import METRICS_FILE, ModelFolderLayout, model_folders

__all__ = ["compare_row", "compare_rows", "model_folders", "pooled_flips", "variant_text"]


def compare_row(m: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Headline numbers of one metrics.json: accuracies, behavioural and attentional gaps with CIs."""
    b, a = m.get("behaviour", {}), m.get("attention", {})
    acc = b.get("accuracy", {})
    g = b.get("inertia_gap", {})
    fc = (b.get("forced_choice") or {}).get("inertia_gap", {})
    ag = a.get("attentional_gap", {})
    wg = a.get("whole_call_gap", {})
    cc = (b.get("forced_choice") or {}).get("copy_control") or {}
    rg = a.get("by_category", {}).get("headline", {}).get("results", {})
    # label = the folder name: unique per (model, dtype, protocol) in a results root, so variants of one
    # model get their own bar and row instead of stacking into one
    row = {"model": m.get("model", folder.name), "label": folder.name, "folder": str(folder),
           "n_items": m.get("n_items"),
           "protocol": m.get("protocol", "matched"),
           # variant identity: dtype and weights/endpoint, so two variants of one model never merge
           "dtype": (m.get("run", {}).get("variant") or {}).get("dtype"),
           "variant": m.get("run", {}).get("variant"),
           "variant_text": variant_text(m),
           "reminder": m.get("reminder"),
           "inertia_gap": g.get("gap"), "inertia_gap_ci95": g.get("ci95"), "mcnemar_p": g.get("mcnemar_p"),
           "inertia_gap_n_pairs": g.get("n_pairs"), "inertia_gap_n_parseable_both": g.get("n_parseable_both"),
           "inertia_gap_warning": g.get("warning"),
           "inertia_gap_parseable_both": (b.get("inertia_gap_parseable_both") or {}).get("gap"),
           "inertia_gap_parseable_both_ci95": (b.get("inertia_gap_parseable_both") or {}).get("ci95"),
           "inertia_gap_prose": ((b.get("prose_readout") or {}).get("inertia_gap") or {}).get("gap"),
           "unparseable": b.get("unparseable_total"), "decisions": b.get("decisions_total"),
           # primary: the query's own tokens (length-matched; matched protocol only)
           "attentional_gap": ag.get("gap"), "attentional_gap_ci95": ag.get("ci95"),
           "attentional_gap_n": ag.get("n"), "attentional_gap_warning": ag.get("warning"),
           "attentional_gap_position_adjusted": (ag.get("position_control") or {}).get("adjusted_gap"),
           "attentional_gap_position_adjusted_ci95": (ag.get("position_control") or {}).get("adjusted_gap_ci95"),
           "attentional_gap_measure": ag.get("measure", "whole_call"),
           "whole_call_gap": wg.get("gap"), "whole_call_gap_ci95": wg.get("ci95"),
           "forced_choice_control_gap": (cc.get("inertia_gap") or {}).get("gap"),
           "forced_choice_control_gap_ci95": (cc.get("inertia_gap") or {}).get("ci95"),
           "copy_control_moves_gap": cc.get("moves_gap_beyond_ci"),
           "results_attention_gap": rg.get("gap_agentic_minus_observer"), "results_attention_gap_ci95": rg.get("ci95"),
           "share_inertia_direction": b.get("flips", {}).get("share_inertia_direction"),
           "forced_choice_inertia_gap": fc.get("gap"), "forced_choice_inertia_gap_ci95": fc.get("ci95"),
           "forced_choice_mcnemar_p": fc.get("mcnemar_p")}
    for fr in FRAMINGS:
        for sub in ("should_research", "should_visit_page"):
            row[f"acc_{fr}_{sub}"] = acc.get(fr, {}).get(sub, {}).get("accuracy")
    return row


def variant_text(m: dict[str, Any]) -> str:
    """One line naming a folder's variant: dtype, weights fingerprint or endpoint, generation settings."""
    run = m.get("run") or {}
    v = run.get("variant") or {}
    dtype = v.get("dtype") or (m.get("attention") or {}).get("dtype") or "unknown dtype"
    parts = [str(dtype)]
    if v.get("weights"):
        parts.append(f"weights {str(v['weights'])[:12]}")
    if v.get("endpoint"):
        parts.append(f"endpoint {v['endpoint']} ({v.get('served_model')})")
    gen = m.get("generation") or {}
    if gen.get("max_new_tokens") is not None:
        budget = gen.get("no_call_tokens")
        parts.append(f"max_new_tokens {gen['max_new_tokens']}, {gen.get('decoding', 'greedy')}"
                     + (f", no-call stop at {budget}" if budget else ""))
    if m.get("reminder"):
        parts.append(f"reminder {m['reminder']}")
    return "; ".join(parts)


def pooled_flips(folders: Sequence[Path], *, seed: int = 0, n_perm: int = 200) -> dict[str, Any]:
    """The flip analysis pooled over the model folders, one protocol at a time (seed 000 A.5 pools the
    models of its Figure 4): free generation and forced choice."""
    from attnprobe.studies.ibis.flips import folder_flip_inputs, pooled_flip_analysis

    by_protocol: dict[str, list[Path]] = {}
    for f in model_folders(folders):
        layout = ModelFolderLayout(f)
        if not layout.decisions.is_file():
            continue
        by_protocol.setdefault(layout.protocol(), []).append(f)
    return {proto: {
        "models": [f.name for f in fs],
        "free_generation": pooled_flip_analysis([folder_flip_inputs(f) for f in fs], seed=seed, n_perm=n_perm),
        "free_generation_parseable_both": pooled_flip_analysis([folder_flip_inputs(f) for f in fs], seed=seed,
                                                               n_perm=n_perm, parseable_both=True),
        "forced_choice": pooled_flip_analysis([folder_flip_inputs(f, forced_choice=True) for f in fs], seed=seed,
                                              n_perm=n_perm)} for proto, fs in by_protocol.items()}


def compare_rows(folders: Sequence[Path]) -> list[dict[str, Any]]:
    """One row per model folder among ``folders`` (:func:`model_folders`), from its metrics.json read
    through :class:`ModelFolderLayout`."""
    rows = []
    for f in model_folders(folders):
        m = ModelFolderLayout(f).read_metrics()
        if m is None:
            raise AttnprobeError(f"{f}: no {METRICS_FILE} (run 'attnprobe ibis report' first)")
        rows.append(compare_row(m, f))
    return rows
