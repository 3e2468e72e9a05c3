"""Trajectory page: turn heatmap, token strip for a chosen reasoning-start token, step breakdown."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import streamlit as st

from attnprobe.results import figures as F
from attnprobe.results.analysis import headline, step_breakdown
from attnprobe_app import common as C
from attnprobe_app import data as D
from attnprobe_app import shaping as SH
from attnprobe_app import study_data as SD

MEAN = "mean of all"


def _pick_capture(root, inv) -> str | None:
    qp = st.query_params
    with st.sidebar:
        st.markdown("### Trajectory")
        show_ibis = st.checkbox("include IBIS decision captures", value=False, key="traj_ibis")
        show_studies = st.checkbox("include studies' per-call captures", value=False, key="traj_studies",
                                   help="the Study page shows them step by step, with links here")
        flt = st.text_input("filter (id, model, folder)", key="traj_filter").strip().lower()
        typed = st.text_input("…or open a capture folder (path inside the data directory)", key="traj_path",
                              value=qp.get("run", "")).strip()
    if typed:
        try:
            folder = D.resolve_inside(root, typed)
        except D.PathEscapeError as exc:
            st.error(str(exc))
            return None
        return D.rel_to(root, folder)
    entries = inv.trajectory_captures(ibis=show_ibis, studies=show_studies)
    if flt:
        entries = [e for e in entries if flt in e.label.lower()]
    if not entries:
        if inv.trajectory_captures(ibis=True, studies=True) and not (show_ibis and show_studies) and not flt:
            C.no_data("trajectory captures", "Only IBIS decision captures or studies' per-call captures are "
                                             "present: tick *include IBIS decision captures* or *include studies' "
                                             "per-call captures* in the sidebar.")
        elif inv.captures and not show_ibis:
            C.no_data("trajectory captures", "Only IBIS decision captures are present: tick *include IBIS decision "
                                             "captures* in the sidebar, or capture a trajectory with "
                                             "`attnprobe capture TRAJECTORIES.jsonl --out DIR/captures`.")
        else:
            C.no_data("trajectory captures" + (" matching the filter" if flt else ""),
                      "Capture one with `attnprobe capture TRAJECTORIES.jsonl --out DIR/captures` (or the Python API: "
                      "`attnprobe.capture(model, trajectory).save(DIR/name)`).")
        return None
    labels = {e.rel: e.label for e in entries}
    with st.sidebar:
        rel = st.selectbox("capture", list(labels), format_func=labels.get, key="traj_run")
    return rel


def render(root, inv) -> None:
    st.title("Trajectory")
    C.show_problems(inv.problems)
    rel = _pick_capture(root, inv)
    if rel is None:
        return
    try:
        res = C.capture(root, rel)
        views = C.capture_views(root, rel)
    except D.DataError as exc:
        st.error(f"Cannot show `{rel}`: {exc}")
        return
    m = res.meta
    st.caption(f"**{res.trajectory_id}** · model `{m.get('model', '?')}` · backend {m.get('backend', '?')} · "
               f"{m.get('dtype', '?')} · rendering {m.get('rendering', '?')} · {res.num_turns} turns · "
               f"{len(res.input_ids)} tokens · {len(res.queries)} queries · folder `{rel}`")
    label = SD.call_models_label(m.get("model"), SD.capture_agent_model(root, rel, res.trajectory_id, m))
    if label:  # a study's call captured with another model than the agent's: every view below is that model's
        st.warning(f"{label}: the attention shown is another model's reading of the agent's context")
    n_heads = int(res.layer_head_attention.shape[2])
    c1, c2, c3 = st.columns([1, 1, 2])
    layer = c1.selectbox("layer", [MEAN] + list(res.layers), key=f"layer:{rel}")
    head = c2.selectbox("head", [MEAN] + list(range(n_heads)), key=f"head:{rel}")
    layer = None if layer == MEAN else int(layer)
    head = None if head == MEAN else int(head)
    steps = [i for i, q in enumerate(res.queries) if q.kind == "reasoning"]
    _turn_heatmap(root, rel, res, views, steps, layer, head)
    qi = _token_strip(rel, res, views, steps, layer, head)
    if qi is not None:
        _steps_and_text(rel, res, views, steps, layer, head, res.queries[qi])


def _turn_heatmap(root, rel: str, res, views: dict, steps: list[int], layer, head) -> None:
    """The turn heatmap of the reasoning-start queries and seed 002's headline shares."""
    st.subheader("Turn heatmap")
    if not steps:
        st.info("This capture has no reasoning-start queries (captured with queries='decision'?), so there is no "
                "turn heatmap. The token strip below still shows the captured query positions.")
    else:
        t0 = time.perf_counter()
        hm = C.heatmap(root, rel, layer, head)
        fig = F.heatmap_figure(hm, views["turn_texts"])
        replaced = SH.turn_status(res.segments, res.meta)
        if replaced:  # a study call: say which turns' observations the policy replaced
            ticks = dict(tickmode="array", tickvals=list(range(res.num_turns)),
                         ticktext=SH.turn_ticks(res.num_turns, replaced))
            fig.update_yaxes(**ticks)  # the rows of the observation triangle are the attended turns
        st.plotly_chart(fig, key="heatmap", config={"displaylogo": False})
        convention = "seed002" if layer is None and head is None else "separate"
        hl = headline([res], layer=layer, head=head, convention=convention)
        k1, k2, k3, k4 = st.columns(4)
        pct = lambda v: f"{100 * v:.1f}%" if np.isfinite(v) else "n/a"  # noqa: E731
        k1.metric("past reasoning / step", pct(hl["past_reasoning_share"]), help=f"{hl['steps']} steps with ≥5 past turns")
        k2.metric("past observations / step", pct(hl["past_observation_share"]))
        k3.metric("obs. attention in newest 10% of past turns", pct(hl["recent10_observation_share"]))
        k4.metric("reasoning attention by midpoint", pct(hl["midpoint_reasoning_share"]))
        st.caption("Shares of each step's attention over the reasoning steps with ≥5 past turns (seed 002, 5.3.1). "
                   + ("Chat-template markers count with the message they open or close (seed 002 convention)."
                      if convention == "seed002" else
                      "One layer or head: template markers are counted separately (segment level)."))
        st.caption(f"Lower triangle (blue): attention from reasoning step t (row) to turn j's reasoning. Upper "
                   f"triangle (orange): from step t (column) to turn j's observation (row). Diagonal masked and left "
                   f"out of the colour limits. {'Layer ' + str(layer) if layer is not None else 'Mean of layers'}, "
                   f"{'head ' + str(head) if head is not None else 'mean of heads'}. "
                   f"Built in {1000 * (time.perf_counter() - t0):.0f} ms.")


def _token_strip(rel: str, res, views: dict, steps: list[int], layer, head) -> int | None:
    """One query's attention over every earlier token, its bars per turn and role, and its most-attended
    tokens; the chosen query's index (None when the capture has no queries)."""
    st.subheader("Token strip")
    if not res.queries:
        st.info("No query positions in this capture.")
        return None
    order = steps + [i for i in range(len(res.queries)) if i not in steps]
    toks = views["token_texts"]

    def fmt(i):
        q = res.queries[i]
        tt = toks[q.position].replace("\n", "⏎").strip() if q.position < len(toks) else ""
        return f"{'reasoning start' if q.kind == 'reasoning' else q.kind} · turn {q.turn} · token {q.position} '{tt}'"

    c1, c2 = st.columns([3, 1])
    qp_q = str(st.query_params.get("q", ""))
    default = int(qp_q) if qp_q.isdigit() else (steps[-1] if steps else 0)  # default: the latest step
    qi = c1.selectbox("query token (reasoning-start tokens first)", order, format_func=fmt,
                      index=order.index(default) if default in order else 0, key=f"query:{rel}")
    log = c2.toggle("log scale", value=True, key="token_log")
    q = res.queries[qi]
    roles, names = SH.token_roles_with_policy(views["token_roles"], res.segments, res.meta)  # placeholders apart
    fig = F.token_strip_figure(res.token_attention[qi], roles, toks, q.position, log=log, names=names,
                               colors=SH.EXTRA_ROLE_COLORS)
    st.plotly_chart(fig, key="token_strip", config={"displaylogo": False})
    st.caption(f"Attention of token {q.position} (turn {q.turn}) over every earlier token, mean of all scored layers "
               "and heads, coloured by role. The per-turn bars below follow the layer/head selectors.")
    row = res.attention(layer, head)[qi]
    st.plotly_chart(C.role_bars(row, res), key="segment_bars", config={"displaylogo": False})
    status, removed = SH.message_status(res.meta), SH.removed_count(res.meta)
    if status or removed:
        st.caption(f"A context policy changed this call's history: {len(status)} message(s) replaced, {removed} "
                   f"removed. {SH.ROLE_LEGEND}")
    vals = np.asarray(res.token_attention[qi][: q.position + 1], dtype=np.float64)
    top = np.argsort(-vals)[:200]
    seg_of = np.zeros(len(res.input_ids), dtype=np.int64)
    for si, s in enumerate(res.segments):
        seg_of[s.start:s.end] = si
    df = pd.DataFrame({
        "token": top, "text": [toks[i] for i in top], "role": [names[roles[i]] for i in top],
        "turn": [res.segments[seg_of[i]].turn for i in top], "attention": vals[top]})
    with st.expander("Most-attended tokens (top 200)"):
        C.paginate(df, key=f"toppage:{rel}", page_size=25)
    return qi


def _steps_and_text(rel: str, res, views: dict, steps: list[int], layer, head, q) -> None:
    """Each step's attention by category (on request) and the text of a chosen turn."""
    if steps:
        st.subheader("Where each step's attention goes")
        # drawn on request: a fourth figure below the fold costs the page's first draw about a third (docs/app.md)
        if st.toggle("draw the per-step breakdown", value=False, key="traj_steps",
                     help="each reasoning step's attention split into system, task, past reasoning, tool calls, "
                          "observations, the current step and template tokens"):
            st.plotly_chart(F.step_breakdown_figure(step_breakdown(res, layer, head)["steps"]), key="steps",
                            config={"displaylogo": False})
    with st.expander("Turn text"):
        t = st.number_input("turn", min_value=0, max_value=res.num_turns - 1, value=int(q.turn), key=f"turn:{rel}")
        tt = views["turn_texts"]
        st.markdown("**Reasoning and tool calls**")
        st.text(tt["reasoning"][t] or "(none)")
        st.markdown("**Observations**")
        st.text(tt["observation"][t] or "(none)")
        if tt["other"][t]:
            st.markdown("**System / task**")
            st.text(tt["other"][t])
