"""Self-contained HTML report (plotly figures, plotly.js embedded once) over capture folders;
the page is the Jinja template ``templates/report.html``."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from attnprobe._version import __version__
from attnprobe.errors import AttnprobeError
from attnprobe.io import atomic_write_text
from attnprobe.results.analysis import decay_curves, headline, heatmap, step_breakdown
from attnprobe.results.figures import decay_figure, heatmap_figure, step_breakdown_figure
from attnprobe.results.formatting import format_ci, template_env
from attnprobe.results.result import META_FILE, CaptureResult

HEADLINE_ROWS = (  # (label, key of analysis.headline) with its defaults: steps with >= 5 past turns, 20 bins
    ("mean attention to past reasoning", "past_reasoning_share"),
    ("mean attention to past tool calls", "past_tool_call_share"),
    ("mean attention to past observations", "past_observation_share"),
    ("reasoning share of (past reasoning + past observations)", "reasoning_vs_observation"),
    ("share of observation attention on the newest 10% of past turns", "recent10_observation_share"),
    ("share of observation attention on the newest half of past turns", "midpoint_observation_share"),
    ("share of reasoning attention on the newest half of past turns", "midpoint_reasoning_share"),
)


@cache
def _template():
    return template_env("attnprobe.results").get_template("report.html")


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


def build_report(results: list[CaptureResult], title: str = "attnprobe report") -> str:
    if not results:
        raise AttnprobeError("no capture results to report on")
    by_model: dict[str, list[CaptureResult]] = {}
    for r in results:
        by_model.setdefault(r.meta.get("model", "?"), []).append(r)
    overall = []
    for model, rs in by_model.items():
        h = headline(rs)
        rows = [("trajectories", len(rs)), (f"reasoning steps with ≥{h['min_past']} past turns", h["steps"])]
        overall.append((model, rows + [(label, format_ci(h[key], signed=False)) for label, key in HEADLINE_ROWS]))
    decay = decay_figure({model: decay_curves(rs) for model, rs in by_model.items()}, ("reasoning", "tool_call",
                                                                                      "observation"))
    decay.update_layout(title="Decay curves (20 bins, reasoning steps with ≥5 past turns)")
    sections = []
    for r in results:
        m = r.meta
        figs = any(q.kind == "reasoning" for q in r.queries) and r.num_turns > 1
        sections.append({"id": r.trajectory_id, "info": [
            ("model", f"{m.get('model')} ({m.get('backend')}, {m.get('dtype')})"),
            ("tokens / turns / queries", f"{len(r.input_ids)} / {r.num_turns} / {len(r.queries)}"),
            ("rendering", m.get("rendering")), ("chat template hash", m.get("chat_template_hash")),
            ("chunk size", m.get("chunk_size")), ("layers scored", f"{len(r.layers)} of {m.get('num_model_layers')}"),
            ("framing", m.get("framing"))],
            "heatmap": _html(heatmap_figure(heatmap(r), r.turn_texts())) if figs else None,
            "steps": _html(step_breakdown_figure(step_breakdown(r)["steps"])) if figs else None})
    return _template().render(title=title, version=__version__, n_results=len(results), overall=overall,
                              decay_figure=_html(decay, plotlyjs=True), sections=sections)


def _html(fig, plotlyjs: bool = False) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=plotlyjs)


def write_report(root: Path, out: Path | None = None) -> Path:
    root = Path(root)
    folders = find_results(root)
    if not folders:
        raise AttnprobeError(f"{root}: no capture results found (run 'attnprobe capture' first)")
    results = [CaptureResult.load(f) for f in folders]
    out = Path(out) if out else root / "report.html"
    atomic_write_text(out, build_report(results))
    return out
