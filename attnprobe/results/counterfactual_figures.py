"""Figures of context counterfactuals (plotly), used by the app page and reports: turn x role mass of
the original and counterfactual context side by side, their difference, and the original token strip
with the removed spans shaded."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnprobe.results.figures import token_strip_figure


def turn_role_pair_figure(original: np.ndarray, counterfactual: np.ndarray, roles: Sequence[str],
                          title: str = "") -> go.Figure:
    """Three heatmaps (turn on x, role on y): original, counterfactual (same colour limits) and the
    difference counterfactual - original (diverging, symmetric limits)."""
    T = original.shape[0]
    keep = [i for i, _ in enumerate(roles) if original[:, i].any() or counterfactual[:, i].any()]
    names = [roles[i] for i in keep]
    o, c = original[:, keep].T, counterfactual[:, keep].T
    d = c - o
    zmax = float(max(o.max(initial=0), c.max(initial=0))) or 1.0
    dmax = float(np.abs(d).max(initial=0)) or 1.0
    fig = make_subplots(rows=1, cols=3, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=("original", "counterfactual", "difference (cf - original)"))
    hover = "turn %{x}<br>%{y}: %{z:.4f}<extra></extra>"
    fig.add_trace(go.Heatmap(z=o, x=np.arange(T), y=names, zmin=0, zmax=zmax, colorscale="Blues", showscale=False,
                             hovertemplate=hover), 1, 1)
    fig.add_trace(go.Heatmap(z=c, x=np.arange(T), y=names, zmin=0, zmax=zmax, colorscale="Blues",
                             colorbar=dict(x=0.64, len=0.9, thickness=10, title="mass"), hovertemplate=hover), 1, 2)
    fig.add_trace(go.Heatmap(z=d, x=np.arange(T), y=names, zmin=-dmax, zmax=dmax, colorscale="RdBu_r",
                             colorbar=dict(x=1.0, len=0.9, thickness=10, title="Δ"), hovertemplate=hover), 1, 3)
    fig.update_layout(title=title or None, height=320, margin=dict(l=90, r=40, t=60 if title else 40, b=40))
    for k in (1, 2, 3):
        fig.update_xaxes(title_text="original turn", row=1, col=k)
    return fig


def redistribution_figure(removed: float, redistribution: dict[str, float], title: str = "") -> go.Figure:
    """Where the removed mass went: one bar per destination group (they sum to the removed mass)."""
    keys = list(redistribution)
    vals = [redistribution[k] for k in keys]
    fig = go.Figure(go.Bar(x=keys, y=vals, marker_color=["#d62728" if v < 0 else "#2ca02c" for v in vals],
                           hovertemplate="%{x}: %{y:+.4f}<extra></extra>"))
    fig.add_hline(y=0, line_width=1)
    fig.update_layout(title=title or f"removed mass {removed:.4f} → change per destination (sums to it)",
                      height=300, margin=dict(l=60, r=20, t=50, b=60), yaxis=dict(title="Δ attention mass"))
    return fig


def removed_strip_figure(values: np.ndarray, roles: np.ndarray, removed: np.ndarray, tok_text: Sequence[str] | None,
                         query_pos: int, log: bool = True, title: str = "") -> go.Figure:
    """:func:`token_strip_figure` of the original context with every removed span shaded red."""
    fig = token_strip_figure(values, roles, tok_text, query_pos, title=title, log=log)
    n = int(query_pos) + 1
    mask = np.asarray(removed[:n], dtype=bool)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    for a, b in zip(edges[::2], edges[1::2]):
        fig.add_vrect(x0=a - 0.5, x1=b - 0.5, fillcolor="#d62728", opacity=0.12, line_width=0, layer="below")
    return fig
