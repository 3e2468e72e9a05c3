"""Plotly figures shared by the HTML report and the Streamlit app: pure functions of numbers already
computed by attnprobe.analysis / attnprobe.ibis (one place for each picture; no Streamlit here)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnprobe.render.segments import ROLES

ROLE_COLORS = {"system": "#7f7f7f", "task": "#2ca02c", "reasoning": "#1f77b4", "tool_call": "#9467bd",
               "observation": "#ff7f0e", "template": "#c7c7c7"}
FRAMING_COLORS = {"agentic": "#d62728", "observer": "#1f77b4", "direct": "#2ca02c"}
HOVER_CELL_LIMIT = 40_000  # above this many cells per triangle, hover text is not embedded per cell
HOVER_CHARS = 160


def _snip(s: str, n: int = HOVER_CHARS) -> str:
    s = " ".join(s.split())
    s = s if len(s) <= n else s[: n - 1] + "…"
    # wrap for the hover box
    out, line = [], ""
    for w in s.split(" "):
        if len(line) + len(w) > 60 and line:
            out.append(line)
            line = w
        else:
            line = f"{line} {w}" if line else w
    out.append(line)
    return "<br>".join(x.replace("<", "&lt;") for x in out)


NO_VALUE_GREY = "#cccccc"  # heatmap background where a cell has no value; darker than the scales' white zero
HEATMAP_GREY_NOTE = (
    "Grey cells have no value (not zero attention, which is white): the diagonal is masked (a step's own "
    "turn), and a turn with no reasoning-step query (turn 0 with the system prompt and task, a tool-call-only "
    "message, a step cut off by truncation) has no row in the lower triangle and no column in the upper one. "
    "When no reasoning step comes after such a turn either (usually the last turn), its whole row and column "
    "are grey.")


def turn_axis(n: int, max_ticks: int = 25) -> dict:
    """Plotly axis settings with integer ticks for ``n`` turns (0..n-1): one tick per turn up to
    ``max_ticks`` turns, else every k-th turn; never the fractional ticks plotly picks for 2-3 turns."""
    return dict(tickmode="linear", tick0=0, dtick=max(1, math.ceil(n / max_ticks)), tickformat="d")


def heatmap_figure(hm, texts: dict[str, list[str]] | None = None, title: str = "") -> go.Figure:
    """Two heatmaps on one grid: lower triangle = attention from step t (row) to turn j's reasoning,
    upper triangle = attention from step t (column) to turn j's observation (row); diagonal masked.
    Cells without a value show the grey background (:data:`HEATMAP_GREY_NOTE` says which)."""
    T = hm.reasoning.shape[0]
    turns = np.arange(T)
    n_cells = int(np.isfinite(hm.reasoning).sum())
    with_text = texts is not None and n_cells <= HOVER_CELL_LIMIT
    rea_kw: dict = {}
    obs_kw: dict = {}
    if with_text:
        rs = [_snip(s) for s in texts["reasoning"]]
        os_ = [_snip(s) for s in texts["observation"]]
        # lower triangle cell (t, j): turn j's reasoning; upper triangle cell (j, t): turn j's observation
        rea_kw["text"] = [[rs[j] if np.isfinite(hm.reasoning[t, j]) else "" for j in range(T)] for t in range(T)]
        obs_kw["text"] = [[os_[j] if np.isfinite(hm.observation[j, t]) else "" for t in range(T)] for j in range(T)]
        tail = "<br>%{text}"
    else:
        tail = ""
    fig = go.Figure()
    fig.add_trace(go.Heatmap(
        z=hm.reasoning.astype(np.float32), x=turns, y=turns, name="reasoning", colorscale="Blues",
        zmin=hm.reasoning_clim[0], zmax=hm.reasoning_clim[1], hoverongaps=False,
        colorbar=dict(title=dict(text="past<br>reasoning", side="top"), x=1.0, len=0.9, thickness=14),
        hovertemplate="step %{y} → turn %{x}<br>role: reasoning<br>attention: %{z:.4f}" + tail + "<extra></extra>",
        **rea_kw))
    fig.add_trace(go.Heatmap(
        z=hm.observation.astype(np.float32), x=turns, y=turns, name="observation", colorscale="Oranges",
        zmin=hm.observation_clim[0], zmax=hm.observation_clim[1], hoverongaps=False,
        colorbar=dict(title=dict(text="past<br>observation", side="top"), x=1.13, len=0.9, thickness=14),
        hovertemplate="step %{x} → turn %{y}<br>role: observation<br>attention: %{z:.4f}" + tail + "<extra></extra>",
        **obs_kw))
    fig.update_layout(
        title=title or None, height=620, margin=dict(l=60, r=140, t=50 if title else 20, b=50),
        xaxis=dict(title="past turn j (lower) · current step t (upper)", constrain="domain", showgrid=False,
                   range=[-0.5, T - 0.5], zeroline=False, **turn_axis(T)),
        yaxis=dict(title="current step t (lower) · past turn j (upper)", autorange="reversed", scaleanchor="x",
                   showgrid=False, zeroline=False, range=[T - 0.5, -0.5], **turn_axis(T)),
        plot_bgcolor=NO_VALUE_GREY)
    return fig


def token_strip_figure(values: np.ndarray, roles: np.ndarray, tok_text: Sequence[str] | None, query_pos: int,
                       title: str = "", log: bool = False, names: Sequence[str] = ROLES,
                       colors: dict[str, str] | None = None) -> go.Figure:
    """Attention of one query over every token up to it, one bar colour per role. ``roles`` index ``names``
    (default the capture roles); ``colors`` adds colours for other names (e.g. a policy's placeholders)."""
    n = int(query_pos) + 1
    vals = np.asarray(values, dtype=np.float64)[:n]
    colors = {**ROLE_COLORS, **(colors or {})}
    fig = go.Figure()
    for ri, role in enumerate(names):
        idx = np.flatnonzero(roles[:n] == ri)
        if idx.size == 0:
            continue
        kw = {}
        if tok_text is not None and n <= 50_000:
            kw["text"] = [tok_text[i].replace("<", "&lt;").replace("\n", "⏎") for i in idx]
            kw["textposition"] = "none"
        fig.add_trace(go.Bar(x=idx, y=vals[idx], name=role, marker_color=colors[role], marker_line_width=0,
                             hovertemplate="token %{x} (" + role + ")<br>%{text}<br>attention: %{y:.5f}<extra></extra>"
                             if kw else "token %{x} (" + role + ")<br>attention: %{y:.5f}<extra></extra>", **kw))
    fig.update_layout(title=title or None, barmode="overlay", bargap=0, height=300,
                      margin=dict(l=60, r=20, t=40 if title else 10, b=40),
                      xaxis=dict(title="token position", range=[-0.5, n - 0.5]),
                      yaxis=dict(title="attention (mean of layers × heads)", type="log" if log else "linear"),
                      legend=dict(orientation="h", y=1.12))
    return fig


def segment_figure(att_row: np.ndarray, segments, num_turns: int) -> go.Figure:
    """Attention of one query summed per (turn, role), as stacked bars per turn."""
    tr = np.zeros((num_turns, len(ROLES)))
    for s, v in zip(segments, att_row):
        tr[s.turn, ROLES.index(s.role)] += v
    fig = go.Figure()
    for ri, role in enumerate(ROLES):
        if not tr[:, ri].any():
            continue
        fig.add_trace(go.Bar(x=np.arange(num_turns), y=tr[:, ri], name=role, marker_color=ROLE_COLORS[role],
                             hovertemplate="turn %{x}<br>" + role + ": %{y:.4f}<extra></extra>"))
    fig.update_layout(barmode="stack", height=280, margin=dict(l=60, r=20, t=10, b=40),
                      xaxis=dict(title="turn", dtick=max(1, num_turns // 25)), yaxis=dict(title="attention mass"),
                      legend=dict(orientation="h", y=1.15))
    return fig


STEP_PARTS = ("system", "task", "past_reasoning", "past_tool_call", "past_observation", "current_step", "template")
STEP_COLORS = {"system": ROLE_COLORS["system"], "task": ROLE_COLORS["task"], "past_reasoning": ROLE_COLORS["reasoning"],
               "past_tool_call": ROLE_COLORS["tool_call"], "past_observation": ROLE_COLORS["observation"],
               "current_step": "#17becf", "template": ROLE_COLORS["template"]}


def step_breakdown_figure(steps: list[dict]) -> go.Figure:
    fig = go.Figure()
    x = [s["turn"] for s in steps]
    for part in STEP_PARTS:
        fig.add_trace(go.Bar(x=x, y=[s[part] for s in steps], name=part.replace("_", " "),
                             marker_color=STEP_COLORS[part],
                             hovertemplate="step %{x}<br>" + part.replace("_", " ") + ": %{y:.3f}<extra></extra>"))
    fig.update_layout(barmode="stack", height=300, margin=dict(l=60, r=20, t=10, b=40),
                      xaxis=dict(title="reasoning step (turn)", **turn_axis(max(x, default=0) + 1)),
                      yaxis=dict(title="share of attention", range=[0, 1]),
                      legend=dict(orientation="h", y=1.18))
    return fig


DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def decay_figure(curves: dict[str, dict], roles: Sequence[str]) -> go.Figure:
    """Mean role attention per normalised past-turn bin, and the cumulative share accumulated from the
    newest past turn back (``analysis.decay_curves``), for several groups."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Mean attention per past-turn bin",
                                                        "Cumulative share (newest → oldest)"))
    for gi, (name, c) in enumerate(curves.items()):
        dash = DASHES[gi % len(DASHES)]
        cum_x = c.get("cumulative_x", c["centers"])
        for role in roles:
            col = ROLE_COLORS.get(role, "#333")
            fig.add_trace(go.Scatter(x=c["centers"], y=c["mean"][role], mode="lines+markers", name=f"{name} · {role}",
                                     legendgroup=name, line=dict(color=col, dash=dash), marker=dict(size=5),
                                     hovertemplate=f"{name}<br>{role}" + "<br>x=%{x:.3f}: %{y:.4f}<extra></extra>"),
                          row=1, col=1)
            fig.add_trace(go.Scatter(x=cum_x, y=c["cumulative"][role], mode="lines", name=f"{name} · {role}",
                                     legendgroup=name, showlegend=False, line=dict(color=col, dash=dash),
                                     hovertemplate=f"{name}<br>{role} cumulative" + "<br>x=%{x:.3f}: %{y:.3f}<extra></extra>"),
                          row=1, col=2)
        fig.add_trace(go.Scatter(x=cum_x, y=c["cumulative"]["all"], mode="lines", name=f"{name} · all past turns",
                                 legendgroup=name, line=dict(color="black", dash=dash, width=2),
                                 hovertemplate=f"{name}<br>all past turns (reasoning + tool calls + observations), cumulative" + "<br>x=%{x:.3f}: %{y:.3f}<extra></extra>"),
                      row=1, col=2)
    fig.update_xaxes(title_text="normalised past-turn position (0 oldest, 1 most recent)", range=[0, 1], row=1, col=1)
    fig.update_xaxes(title_text="share of past turns, counted from the newest", range=[0, 1], row=1, col=2)
    fig.update_yaxes(title_text="mean attention mass", row=1, col=1)
    fig.update_yaxes(title_text="cumulative share", row=1, col=2)
    fig.update_layout(height=460, margin=dict(l=60, r=20, t=40, b=50), legend=dict(orientation="h", y=-0.25))
    return fig


def _error_y(values: Sequence, lows: Sequence, highs: Sequence) -> dict:
    """Asymmetric error bars from interval ends (0 where the value or an end is missing)."""
    return dict(type="data", symmetric=False,
                array=[h - v if v is not None and h is not None else 0 for v, h in zip(values, highs)],
                arrayminus=[v - lo if v is not None and lo is not None else 0 for v, lo in zip(values, lows)])


def framing_bars(values: dict[str, dict[str, float]], categories: Sequence[str], title: str = "",
                 errors: dict[str, dict[str, tuple[float, float]]] | None = None) -> go.Figure:
    """Grouped bars: x = category, one bar per framing."""
    fig = go.Figure()
    for fr, by_cat in values.items():
        kw = {}
        if errors and fr in errors:
            ends = [errors[fr].get(c) or (None, None) for c in categories]
            kw["error_y"] = _error_y([by_cat[c] for c in categories], [e[0] for e in ends], [e[1] for e in ends])
        fig.add_trace(go.Bar(x=list(categories), y=[by_cat.get(c) for c in categories], name=fr,
                             marker_color=FRAMING_COLORS.get(fr), **kw,
                             hovertemplate=fr + "<br>%{x}: %{y:.4f}<extra></extra>"))
    fig.update_layout(barmode="group", title=title or None, height=360, yaxis_title="attention mass",
                      margin=dict(l=60, r=20, t=70 if title else 30, b=40),
                      legend=dict(orientation="h", y=1.0, yanchor="bottom", x=1.0, xanchor="right"))
    return fig


def head_gap_figure(matrix: np.ndarray, layers: Sequence[int], title: str) -> go.Figure:
    m = np.asarray(matrix, dtype=float)
    lim = float(np.nanmax(np.abs(m))) if np.isfinite(m).any() else 1.0
    fig = go.Figure(go.Heatmap(z=m.T, x=list(layers), y=list(range(m.shape[1])), colorscale="RdBu_r",
                               zmin=-lim or -1, zmax=lim or 1, colorbar=dict(title="gap"),
                               hovertemplate="layer %{x}, head %{y}<br>agentic − observer: %{z:.5f}<extra></extra>"))
    fig.update_layout(title=title, height=320, xaxis_title="layer", yaxis_title="head",
                      margin=dict(l=60, r=20, t=40, b=40))
    return fig


# ------------------------------------------------------------------ IBIS (numbers from metrics.json)
IBIS_SUBSETS = ("should_research", "should_visit_page", "headline")


def accuracy_figure(accuracy: dict[str, dict[str, dict]], subsets: Sequence[str] = IBIS_SUBSETS) -> go.Figure:
    """Next-action accuracy per framing and subset with Wilson CIs (``behaviour.accuracy``)."""
    fig = go.Figure()
    for fr, subs in accuracy.items():
        xs = [s for s in subsets if s in subs]
        ys = [subs[s]["accuracy"] for s in xs]
        fig.add_bar(name=fr, x=xs, y=ys, marker_color=FRAMING_COLORS.get(fr), error_y=_error_y(
            ys, [subs[s]["ci95_wilson"][0] for s in xs], [subs[s]["ci95_wilson"][1] for s in xs]))
    fig.update_layout(title="Next-action accuracy per framing (95% Wilson CI)", barmode="group",
                      yaxis=dict(range=[0, 1], title="accuracy"))
    return fig


def decision_mix_figure(accuracy: dict[str, dict[str, dict]], decisions: Sequence[str],
                        subsets: Sequence[str] = IBIS_SUBSETS[:2]) -> go.Figure:
    """Share of each decision (web_search, visit_page, ...) per framing and subset, stacked."""
    fig = go.Figure()
    cells = [(fr, s, subs[s]) for fr, subs in accuracy.items() for s in subsets if s in subs]
    for dec in decisions:
        fig.add_bar(name=dec, x=[f"{fr}<br>{s}" for fr, s, _ in cells], y=[e["decisions"][dec] / e["n"] for *_, e in cells])
    fig.update_layout(title="What the model did (share of decisions)", barmode="stack")
    return fig


def layer_gap_figure(layers: Sequence[int], per_layer: dict[str, dict[str, list]]) -> go.Figure:
    """Per-layer agentic - observer gap per category with its CI (``attention.per_layer_gap``)."""
    fig = go.Figure()
    for cat, e in per_layer.items():
        fig.add_scatter(x=list(layers), y=e["gap"], name=cat, mode="lines+markers",
                        error_y=_error_y(e["gap"], e["lo"], e["hi"]))
    fig.update_layout(title="Per-layer gap, agentic - observer (95% bootstrap CI)", xaxis_title="layer",
                      yaxis_title="attention mass difference")
    return fig


def ibis_compare_figure(rows: list[dict]) -> go.Figure:
    """Behavioural and attentional inertia gap per model with CIs (rows of ``ibis.compare.compare_rows``)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "Behavioural inertia gap (observer - agentic, should_research)",
        "Attentional gap (query tokens, length-matched: own - external)"))
    names = [r.get("label") or r["model"] for r in rows]  # one bar per variant (folder), never stacked
    for col, key, name in ((1, "inertia_gap", "inertia gap"), (2, "attentional_gap", "attentional gap")):
        # only the length-matched measure is plotted; a folder without it shows no bar
        vals = [r[key] if key != "attentional_gap" or r.get("attentional_gap_measure") == "query_tokens" else None
                for r in rows]
        cis = [r[f"{key}_ci95"] or (None, None) for r in rows]
        fig.add_bar(x=names, y=vals, error_y=_error_y(vals, [c[0] for c in cis], [c[1] for c in cis]), name=name,
                    row=1, col=col)
    fig.update_yaxes(title_text="accuracy difference", row=1, col=1)
    fig.update_yaxes(title_text="attention mass difference", row=1, col=2)
    fig.update_layout(title="IBIS across models (95% bootstrap CIs)", showlegend=False)
    return fig
