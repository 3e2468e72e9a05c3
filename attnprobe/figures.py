"""Plotly figures shared by the HTML report and the Streamlit app (one place for each picture)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .analysis import Heatmap, decay_curves, heatmap, step_breakdown
from .result import CaptureResult

ROLE_COLORS = {"system": "#7f7f7f", "task": "#2ca02c", "reasoning": "#1f77b4", "tool_call": "#9467bd",
               "observation": "#ff7f0e", "template": "#c7c7c7"}


def turn_snippets(result: CaptureResult, width: int = 160) -> dict[tuple[int, str], str]:
    """First characters of each (turn, role) text, for hover labels."""
    out: dict[tuple[int, str], str] = {}
    if result.offsets is None or not result.text:
        return out
    for seg in result.segments:
        key = (seg.turn, seg.role)
        if key in out or seg.role == "template":
            continue
        a, b = int(result.offsets[seg.start][0]), int(result.offsets[seg.end - 1][1])
        snippet = " ".join(result.text[a:b].split())
        out[key] = snippet[:width] + ("…" if len(snippet) > width else "")
    return out


def heatmap_figure(result: CaptureResult, hm: Heatmap | None = None, *, layer: int | None = None,
                   head: int | None = None, title: str | None = None):
    """Reasoning attention in blue (lower triangle), observation attention in orange (upper,
    transposed); the diagonal is masked and colour limits ignore it."""
    import plotly.graph_objects as go

    hm = hm if hm is not None else heatmap(result, layer, head)
    T = hm.reasoning.shape[0]
    snippets = turn_snippets(result)
    turns = np.arange(T)
    rea_text = np.empty((T, T), dtype=object)
    obs_text = np.empty((T, T), dtype=object)
    for t in range(T):
        for j in range(T):
            rea_text[t, j] = f"step {t} → turn {j} reasoning<br>{snippets.get((j, 'reasoning'), '')}"
            obs_text[j, t] = f"step {t} → turn {j} observation<br>{snippets.get((j, 'observation'), '')}"
    fig = go.Figure()
    fig.add_trace(go.Heatmap(
        z=hm.reasoning, x=turns, y=turns, colorscale="Blues", zmin=hm.reasoning_clim[0], zmax=hm.reasoning_clim[1],
        text=rea_text, hovertemplate="%{text}<br>attention %{z:.4f}<extra></extra>", name="reasoning",
        colorbar=dict(title="reasoning", x=1.0, len=0.45, y=0.25), hoverongaps=False))
    fig.add_trace(go.Heatmap(
        z=hm.observation, x=turns, y=turns, colorscale="Oranges", zmin=hm.observation_clim[0],
        zmax=hm.observation_clim[1], text=obs_text, hovertemplate="%{text}<br>attention %{z:.4f}<extra></extra>",
        name="observation", colorbar=dict(title="observation", x=1.0, len=0.45, y=0.75), hoverongaps=False))
    fig.update_layout(
        title=title or f"{result.trajectory_id}: attention by past turn",
        xaxis_title="past turn j (lower: reasoning of j) / current step t (upper)",
        yaxis_title="current step t (lower) / past turn j (upper: observation of j)",
        yaxis=dict(autorange="reversed", scaleanchor="x"), height=560, margin=dict(l=60, r=40, t=60, b=60))
    return fig


def breakdown_figure(result: CaptureResult, *, layer: int | None = None, head: int | None = None):
    """Stacked shares per reasoning step: where does each step's attention go?"""
    import plotly.graph_objects as go

    rows = step_breakdown(result, layer, head)["steps"]
    keys = [("system", "#7f7f7f"), ("task", "#2ca02c"), ("past_reasoning", "#1f77b4"),
            ("past_tool_call", "#9467bd"), ("past_observation", "#ff7f0e"), ("current_step", "#17becf"),
            ("template", "#c7c7c7")]
    fig = go.Figure()
    x = [r["turn"] for r in rows]
    for key, color in keys:
        fig.add_trace(go.Bar(x=x, y=[r[key] for r in rows], name=key.replace("_", " "), marker_color=color))
    fig.update_layout(barmode="stack", title=f"{result.trajectory_id}: share of attention per reasoning step",
                      xaxis_title="reasoning step (turn)", yaxis_title="attention share", height=420,
                      yaxis=dict(range=[0, 1]))
    return fig


def decay_figure(groups: dict[str, Sequence[CaptureResult]], *, bins: int = 20, min_past: int = 5,
                 layer: int | None = None, head: int | None = None):
    """Mean role attention and cumulative share over normalised past-turn position, one line per group."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("mean attention per past turn", "cumulative share"))
    dashes = ["solid", "dash", "dot", "dashdot", "longdash"]
    for gi, (name, results) in enumerate(groups.items()):
        d = decay_curves(results, bins=bins, min_past=min_past, layer=layer, head=head)
        for role in ("reasoning", "observation", "tool_call"):
            style = dict(color=ROLE_COLORS[role], dash=dashes[gi % len(dashes)])
            fig.add_trace(go.Scatter(x=d["centers"], y=d["mean"][role], mode="lines+markers", line=style,
                                     name=f"{name} · {role}", legendgroup=name), row=1, col=1)
            fig.add_trace(go.Scatter(x=d["centers"], y=d["cumulative"][role], mode="lines", line=style,
                                     name=f"{name} · {role} (cum.)", legendgroup=name, showlegend=False),
                          row=1, col=2)
        fig.add_trace(go.Scatter(x=d["centers"], y=d["cumulative"]["all"], mode="lines",
                                 line=dict(color="black", dash=dashes[gi % len(dashes)]),
                                 name=f"{name} · all past turns (cum.)", legendgroup=name), row=1, col=2)
    fig.update_xaxes(title_text="past-turn position (0 oldest, 1 most recent)", range=[0, 1])
    fig.update_yaxes(title_text="attention", row=1, col=1)
    fig.update_yaxes(title_text="cumulative share", row=1, col=2)
    fig.update_layout(height=450, title=f"Decay curves ({bins} bins, steps with ≥{min_past} past turns)")
    return fig
