"""report.md / report.html of one IBIS model folder, and the cross-model compare.md / compare.html.

Numbers come from ``metrics.compute_metrics`` (metrics.json) and ``compare.compare_rows``; the text
from the Jinja templates in ``templates/``; the figures from ``attnprobe.results.figures``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from attnprobe.io import atomic_write_text
from attnprobe.results import figures as F
from attnprobe.results.formatting import template_env
from attnprobe.studies.ibis.behaviour import DECISIONS
from attnprobe.studies.ibis.compare import compare_rows, pooled_flips, variant_text
from attnprobe.studies.ibis.framings import CATEGORIES, FRAMINGS
from attnprobe.studies.ibis.layout import (
    COMPARE_HTML,
    COMPARE_MD,
    REPORT_HTML,
    REPORT_MD,
    CompareLayout,
    ModelFolderLayout,
)
from attnprobe.studies.ibis.metrics import compute_metrics


@cache
def _template(name: str) -> jinja2.Template:
    return template_env("attnprobe.studies.ibis").get_template(name)


def markdown_report(m: dict) -> str:
    cats = (m.get("attention") or {}).get("categories") or list(CATEGORIES)
    return _template(REPORT_MD).render(m=m, categories=cats, variant_text=variant_text).rstrip("\n") + "\n"


def report_figures(m: dict) -> list:
    """The plotly figures of report.html: accuracy and decision mix per framing; attention mass per
    category, the per-layer gap and the layer x head gap of the own call (when captured)."""
    figs = []
    if b := m.get("behaviour"):
        figs += [F.accuracy_figure(b["accuracy"]), F.decision_mix_figure(b["accuracy"], DECISIONS)]
    a = m.get("attention")
    if a and "by_category" in a:
        sub = a["by_category"]["headline"]
        cats = a.get("categories") or list(CATEGORIES)
        head_cat = "query" if "query" in a["heads"] else "results"
        figs += [
            F.framing_bars({fr: {c: sub[c][fr] for c in cats} for fr in a["framings"]}, cats,
                           "Decision-token attention mass per category (mean over layers, heads, items)"),
            F.layer_gap_figure(a["layers"], a["per_layer_gap"]),
            F.head_gap_figure(a["heads"][head_cat]["gap_matrix"], a["layers"],
                              "Query tokens, length-matched: own (agentic) - external (observer), per layer and head"
                              if head_cat == "query"
                              else "Results: agentic - observer, per layer and head")]
    return figs


def _figure_html(figs: Sequence, plotlyjs: str | bool) -> list[str]:
    """plotly.js once (inline or from the CDN), before the first figure."""
    return [fig.to_html(full_html=False, include_plotlyjs=plotlyjs if i == 0 else False) for i, fig in enumerate(figs)]


def html_report(m: dict, *, plotlyjs: str | bool = True) -> str:
    return _template(REPORT_HTML).render(m=m, figures=_figure_html(report_figures(m), plotlyjs),
                                           markdown=markdown_report(m))


def write_report(folder: Path, *, n_boot: int = 10000, seed: int = 0, n_perm: int = 200,
                 plotlyjs: str | bool = True) -> dict[str, Any]:
    """Aggregate captures (when present), then write metrics.json, report.md and report.html."""
    folder = Path(folder)
    layout = ModelFolderLayout(folder)
    if layout.captures.is_dir() and layout.items.is_file():
        from attnprobe.studies.ibis.attention import aggregate

        aggregate(layout.read_items(), folder, protocol=layout.ibis_protocol())  # with the reminder the run used
    m = compute_metrics(folder, n_boot=n_boot, seed=seed, n_perm=n_perm)
    atomic_write_text(layout.metrics, json.dumps(m, indent=1))
    atomic_write_text(layout.report_md, markdown_report(m))
    atomic_write_text(layout.report_html, html_report(m, plotlyjs=plotlyjs))
    return m


# ------------------------------------------------------------------ across models
def compare_table(rows: list[dict], pooled: dict | None = None) -> str:
    return _template(COMPARE_MD).render(rows=rows, framings=FRAMINGS, pooled=pooled or {}).rstrip("\n")


def compare(folders: Sequence[Path], out: Path, *, plotlyjs: str | bool = True, seed: int = 0,
            n_perm: int = 200) -> tuple[list[dict], str]:
    """compare.json (one row per model), compare_flips.json (the flip analysis pooled across models, per
    protocol), compare.md and compare.html over the model folders (or results roots) given."""
    rows = compare_rows(folders)
    pooled = pooled_flips(folders, seed=seed, n_perm=n_perm)
    table = compare_table(rows, pooled)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    layout = CompareLayout(out)
    atomic_write_text(layout.rows_json, json.dumps(rows, indent=1))
    atomic_write_text(layout.flips_json, json.dumps(pooled, indent=1))
    atomic_write_text(layout.table_md, table + "\n")
    atomic_write_text(layout.page_html, _template(COMPARE_HTML).render(
        figure=_figure_html([F.ibis_compare_figure(rows)], plotlyjs)[0], table=table))
    return rows, table
