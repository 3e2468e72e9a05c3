"""Decay page: 20-bin decay curves and cumulative shares, several runs or models overlaid."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from attnprobe.results import figures as F
from attnprobe.results.analysis import decay_curves, headline
from attnprobe_app import common as C
from attnprobe_app import data as D

ROLES_SHOWN = ("reasoning", "tool_call", "observation")
PRESELECT = 12  # runs chosen when the page opens (each is loaded and binned)


def render(root, inv) -> None:
    st.title("Decay")
    C.show_problems(inv.problems)
    with st.sidebar:
        with_studies = st.checkbox("include studies' per-call captures", value=False, key="decay_studies",
                                   help="attnprobe study attention captures every recorded call (most have 1-3 "
                                        "turns); the Study page shows them step by step")
    entries = inv.trajectory_captures(studies=with_studies)
    if not entries:
        if inv.trajectory_captures(studies=True):
            C.no_data("trajectory captures outside studies", "Only studies' per-call captures are present: tick "
                                                             "*include studies' per-call captures* in the sidebar.")
            return
        C.no_data("trajectory captures", "Decay curves need captures with reasoning-start queries: "
                                         "`attnprobe capture TRAJECTORIES.jsonl --out DIR/captures`.")
        return
    labels = {e.rel: e.label for e in entries}
    with st.sidebar:
        st.markdown("### Decay")
        n_models = len({e.model for e in entries})
        group_by = st.radio("overlay", ["model", "run"], index=0 if n_models > 1 else 1, horizontal=True,
                            key="decay_group",
                            help="one curve set per model (its runs pooled) or per run")
        bins = st.slider("bins", 5, 40, 20, key="decay_bins")
        min_past = st.slider("min. past turns per step", 1, 20, 5, key="decay_min_past")
        roles = st.multiselect("roles", ROLES_SHOWN, default=["reasoning", "observation"], key="decay_roles")
    chosen = st.multiselect("runs", list(labels), default=list(labels)[:PRESELECT], format_func=labels.get,
                            key="decay_runs")
    if len(labels) > PRESELECT:
        st.caption(f"The first {PRESELECT} of {len(labels)} runs (by folder) are preselected; add or remove runs "
                   "in the box above.")
    if not chosen:
        st.info("Choose one or more runs above.")
        return
    if not roles:
        st.info("Choose at least one role in the sidebar.")
        return
    groups: dict[str, list] = {}
    failed = []
    for rel in chosen:
        try:
            res = C.capture(root, rel)
        except D.DataError as exc:
            failed.append(str(exc))
            continue
        if group_by == "model":
            key = str(res.meta.get("model", "?"))
        else:
            key = res.trajectory_id if res.trajectory_id not in groups else f"{res.trajectory_id} ({rel})"
        groups.setdefault(key, []).append(res)
    for f in failed:
        st.error(f"Skipped: {f}")
    curves, rows = {}, []
    for name, results in groups.items():
        c = decay_curves(results, bins=bins, min_past=min_past, roles=ROLES_SHOWN)
        hl = headline(results, min_past=min_past)
        rows.append({"group": name, "runs": len(results), "steps": hl["steps"],
                     "past reasoning": hl["past_reasoning_share"], "past tool calls": hl["past_tool_call_share"],
                     "past observations": hl["past_observation_share"], "system": hl["system_share"],
                     "user": hl["user_share"], "current step": hl["current_step_share"],
                     "obs. in newest 10% of past turns": hl["recent10_observation_share"],
                     "obs. by midpoint": hl["midpoint_observation_share"],
                     "reasoning by midpoint": hl["midpoint_reasoning_share"]})
        if c["num_steps"]:
            curves[name] = c
    if not curves:
        st.warning(f"No reasoning step in the chosen runs has at least {min_past} past turns, so there is nothing "
                   "to bin. Lower *min. past turns per step* in the sidebar or choose longer runs.")
    else:
        st.plotly_chart(F.decay_figure(curves, roles), key="decay", config={"displaylogo": False})
        st.caption(f"Past turn j of step t sits at j/(t−1) (0 oldest, 1 most recent), in {bins} equal-width bins; only "
                   f"steps with ≥{min_past} past turns. The cumulative share accumulates from the newest past turn "
                   "back and stays below 100% because system, user and the current step take the rest (seed 002, "
                   "E.5). Chat-template markers count with the message they open or close. Solid/dashed/dotted "
                   "lines tell the groups apart.")
    st.subheader("Headline figures")
    df = pd.DataFrame(rows)
    C.paginate(df.replace({np.nan: None}), key="decay_table")
