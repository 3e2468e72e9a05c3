"""Counterfactual page: one (trajectory, policy, step) of an ``attnprobe counterfactual`` run: the
original and counterfactual attention by original turn and role side by side, their difference,
where the removed mass went, and the original token strip with the removed spans shaded."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from attnprobe.results import counterfactual_figures as CF
from attnprobe_app import common as C
from attnprobe_app import data as D

RECORD, MASSES = "record.json", "masses.safetensors"
MAX_STEPS = 5000


def find_steps(root: Path) -> list[str]:
    """Step folders (``.../<trajectory>/<policy>/step_*`` with a record) inside the data directory."""
    out = []
    for p in sorted(root.glob(f"**/step_*/{RECORD}")):
        out.append(D.rel_to(root, p.parent))
        if len(out) >= MAX_STEPS:
            break
    return out


def render(root, inventory) -> None:
    st.title("Context counterfactual")
    root = Path(root)
    steps = find_steps(root)
    if not steps:
        C.no_data("counterfactual runs", "Run `attnprobe counterfactual TRAJECTORIES.jsonl --policy mask:5 "
                                         "--policy ircot:oq --out DIR/counterfactual`.")
        return
    with st.sidebar:
        st.markdown("### Counterfactual")
        rel = st.selectbox("step (trajectory / policy / step)", steps, key="cf_step")
        query = st.radio("query", ["decision", "reasoning"], key="cf_query", horizontal=True)
    try:
        record = D.read_json(root, Path(rel) / RECORD)
        arrays = D.read_safetensors(root, Path(rel) / MASSES)
        original = C.capture(root, str(Path(rel) / "original"))
        views = C.capture_views(root, str(Path(rel) / "original"))
    except D.DataError as exc:
        st.error(f"Cannot show `{rel}`: {exc}")
        return
    qi = 0 if query == "decision" else 1
    q = record["queries"][query]
    tok = record["tokens"]
    st.caption(f"**{record['trajectory_id']}** · policy **{record['policy']}** · step at message "
               f"{record['step_message_index']} (turn {record['turn']}) · folder `{rel}`")
    k1, k2, k3, k4 = st.columns(4)
    k1.metric("removed spans held", f"{100 * q['removed_mass']:.1f}%",
              help="original attention on the removed, masked or refined spans")
    k2.metric("of it on observations", f"{100 * q['removed_observation_mass']:.1f}%")
    k3.metric("tokens saved", f"{tok['saved']} ({100 * tok['saved_share']:.0f}%)")
    act = record.get("action")
    k4.metric("next action", "changed" if act and act["changed"] else ("same" if act else "not run"),
              help=(f"original: {act['original']['decision']} · counterfactual: {act['counterfactual']['decision']}"
                    if act else "run with --actions"))
    roles = record["roles"]
    st.subheader("Attention by original turn and role")
    st.plotly_chart(CF.turn_role_pair_figure(arrays["mass_original"][qi], arrays["mass_counterfactual"][qi], roles),
                    key="cf_pair", config={"displaylogo": False})
    st.caption("Masked observations keep their turn (role `placeholder`); refined ones show as `refined`. "
               "Markers count with the message they delimit (seed 002 convention).")
    st.plotly_chart(CF.redistribution_figure(q["removed_mass"], q["redistribution"]), key="cf_red",
                    config={"displaylogo": False})
    st.subheader("Original token strip (removed spans shaded)")
    pos = original.queries[qi].position
    fig = CF.removed_strip_figure(original.token_attention[qi], views["token_roles"],
                                  arrays["removed_tokens"].astype(bool), views["token_texts"], pos,
                                  log=st.toggle("log scale", value=True, key="cf_log"))
    st.plotly_chart(fig, key="cf_strip", config={"displaylogo": False})
    with st.expander("What the policy changed"):
        changed = {k: v for k, v in record["changes"].items() if v != "kept"}
        st.json(changed or {"(nothing)": "every message kept"})
    if act:
        with st.expander("Next action in both contexts"):
            c1, c2 = st.columns(2)
            c1.markdown("**original**")
            c1.text(act["original"]["text"])
            c2.markdown("**counterfactual**")
            c2.text(act["counterfactual"]["text"])
