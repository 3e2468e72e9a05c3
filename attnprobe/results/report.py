"""Self-contained HTML report (plotly figures, plotly.js embedded once) over capture folders."""

from __future__ import annotations

import html
import json
from pathlib import Path

from attnprobe._version import __version__
from attnprobe.errors import AttnprobeError
from attnprobe.io import atomic_write_text
from attnprobe.results.analysis import decay_curves, headline, heatmap, step_breakdown
from attnprobe.results.figures import decay_figure, heatmap_figure, step_breakdown_figure
from attnprobe.results.result import META_FILE, CaptureResult


def find_results(root: Path) -> list[Path]:
    """Every capture folder below root (a folder whose meta.json has a trajectory_id)."""
    out = []
    for meta in sorted(Path(root).rglob(META_FILE)):
        try:
            data = json.loads(meta.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and "trajectory_id" in data and "format_version" in data:
            out.append(meta.parent)
    return out


def _table(rows: list[tuple[str, str]]) -> str:
    return "<table>" + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows) + "</table>"


def _fmt(x: float) -> str:
    return "n/a" if x != x else f"{x:.4f}"


def build_report(results: list[CaptureResult], title: str = "attnprobe report") -> str:
    if not results:
        raise AttnprobeError("no capture results to report on")
    figs: list[str] = []
    include = {"v": True}

    def fig_html(fig) -> str:
        out = fig.to_html(full_html=False, include_plotlyjs=include["v"])
        include["v"] = False
        return out

    by_model: dict[str, list[CaptureResult]] = {}
    for r in results:
        by_model.setdefault(r.meta.get("model", "?"), []).append(r)
    overall = []
    for model, rs in by_model.items():
        h = headline(rs)
        overall.append(f"<h3>{html.escape(model)}</h3>" + _table([
            ("trajectories", str(len(rs))), ("reasoning steps", str(h["num_steps"])),
            ("mean attention to past reasoning", _fmt(h["past_reasoning"])),
            ("mean attention to past tool calls", _fmt(h["past_tool_call"])),
            ("mean attention to past observations", _fmt(h["past_observation"])),
            ("reasoning share of (past reasoning + past observations)", _fmt(h["reasoning_vs_observation"])),
            (f"share of observation attention on the most recent {int(h['recent_fraction'] * 100)}% of turns "
             f"({h['recent_steps']} steps with ≥5 past turns)", _fmt(h["recent_observation_share"])),
        ]))
    curves = {model: decay_curves(rs) for model, rs in by_model.items()}
    fig = decay_figure(curves, ("reasoning", "tool_call", "observation"))
    fig.update_layout(title="Decay curves (20 bins, reasoning steps with ≥5 past turns)")
    figs.append(fig_html(fig))
    sections = []
    for r in results:
        m = r.meta
        info = _table([
            ("model", f"{m.get('model')} ({m.get('backend')}, {m.get('dtype')})"),
            ("tokens / turns / queries", f"{len(r.input_ids)} / {r.num_turns} / {len(r.queries)}"),
            ("rendering", str(m.get("rendering"))), ("chat template hash", str(m.get("chat_template_hash"))),
            ("chunk size", str(m.get("chunk_size"))), ("layers scored", f"{len(r.layers)} of {m.get('num_model_layers')}"),
            ("framing", str(m.get("framing"))),
        ])
        parts = [f"<h2 id='{html.escape(r.trajectory_id)}'>{html.escape(r.trajectory_id)}</h2>", info]
        if any(q.kind == "reasoning" for q in r.queries) and r.num_turns > 1:
            parts.append("<h3>Attention by past turn</h3><p>Lower triangle: attention from step t to turn j's "
                         "reasoning; upper triangle (transposed): to turn j's observations; diagonal masked.</p>")
            parts.append(fig_html(heatmap_figure(heatmap(r), r.turn_texts())))
            parts.append("<h3>Where each reasoning step's attention goes</h3>")
            parts.append(fig_html(step_breakdown_figure(step_breakdown(r)["steps"])))
        else:
            parts.append("<p>No reasoning-step queries in this capture: heatmap not applicable.</p>")
        sections.append("\n".join(parts))
    style = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
             "table{border-collapse:collapse;margin:0.5em 0 1.5em}th,td{border:1px solid #ddd;padding:4px 10px;"
             "text-align:left}th{background:#f6f6f6;font-weight:500}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<p>attnprobe {__version__}; {len(results)} trajectories. Attention from each reasoning-start token, "
            f"averaged over layers and heads, summed by turn and role.</p>"
            f"<h2>Overall</h2>{''.join(overall)}{figs[0]}{''.join(sections)}</body></html>")


def write_report(root: Path, out: Path | None = None) -> Path:
    root = Path(root)
    folders = find_results(root)
    if not folders:
        raise AttnprobeError(f"{root}: no capture results found (run 'attnprobe capture' first)")
    results = [CaptureResult.load(f) for f in folders]
    out = Path(out) if out else root / "report.html"
    atomic_write_text(out, build_report(results))
    return out
