"""Counterfactual page: one (trajectory, policy, step) of an ``attnprobe counterfactual`` run: the
original and counterfactual attention by original turn and role side by side, their difference,
where the removed mass went, and the original token strip with the removed spans shaded."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from attnprobe.counterfactual.layout import ORIGINAL_DIR, CounterfactualLayout
from attnprobe.errors import AttnprobeError
from attnprobe.results import counterfactual_figures as CF
from attnprobe_app import common as C
from attnprobe_app import data as D

MAX_STEPS = 5000


def find_steps(root: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """(step folders ``.../<trajectory>/<policy>/step_*`` with a record inside the data directory,
    problems): :meth:`CounterfactualLayout.find_steps` rooted at the data directory."""
    return CounterfactualLayout(Path("."), Path(root)).find_steps(MAX_STEPS)


def _skipped(problems: list[tuple[str, str]]) -> None:
    if problems:
        with st.expander(f"Skipped: {len(problems)} step folder{'s' if len(problems) > 1 else ''}"):
            for where, why in problems:
                st.markdown(f"- `{where}`: {why}")


def render(root, inventory) -> None:
    st.title("Context counterfactual")
    root = Path(root)
    steps, problems = find_steps(root)
    if not steps:
        _skipped(problems)
        C.no_data("counterfactual runs", "Run `attnprobe counterfactual TRAJECTORIES.jsonl --policy mask:5 "
                                         "--policy ircot:oq --out DIR/counterfactual`.")
        return
    with st.sidebar:
        st.markdown("### Counterfactual")
        rel = st.selectbox("step (trajectory / policy / step)", steps, key="cf_step")
        query = st.radio("query", ["decision", "reasoning"], key="cf_query", horizontal=True)
    _skipped(problems)
    layout = CounterfactualLayout(Path("."), root)  # the page's steps are found anywhere in the data directory
    try:
        record = layout.read_record(rel, app=True)  # the stage's one validator, with the page's fields
        arrays = layout.read_masses(rel, check=True)
        original_rel = D.rel_to(root, layout.capture(rel, ORIGINAL_DIR))
        original = C.capture(root, original_rel)
        views = C.capture_views(root, original_rel)
    except AttnprobeError as exc:
        st.error(f"Cannot show `{rel}`: {exc}")
        return
    try:
        show(record, arrays, original, views, rel, query)
    except (KeyError, IndexError, TypeError, ValueError) as exc:  # a record that passed the check but not the plot
        st.error(f"Cannot show `{rel}`: {type(exc).__name__}: {exc}")


def show(record: dict, arrays: dict, original, views: dict, rel: str, query: str) -> None:
    qi = 0 if query == "decision" else 1
    q = record["queries"][query]
    tok = record["tokens"]
    st.caption(f"**{record['trajectory_id']}** · policy **{record['policy']}** · step at message "
               f"{record['step_message_index']} (turn {record['turn']}) · folder `{rel}`")
    k1, k2, k3, k4 = st.columns(4)
    changed = q.get("changed_message_mass", q["removed_mass"])  # records before issue 26 had only the latter
    k1.metric("removed mass", f"{100 * q['removed_mass']:.1f}%" if "changed_message_mass" in q else "n/a",
              help=f"original attention on the tokens absent from the counterfactual context; on the changed "
                   f"messages (markers and kept text included): {100 * changed:.1f}%")
    k2.metric("of it on observations", f"{100 * q['removed_observation_mass']:.1f}%")
    k3.metric("tokens saved", f"{tok['saved']} ({100 * tok['saved_share']:.0f}%)")
    act = record.get("action")
    k4.metric("next action", "changed" if act and act.get("changed") else ("same" if act else "not run"),
              help=(f"original: {act['original']['decision']} · counterfactual: {act['counterfactual']['decision']}"
                    if act else "run with --actions"))
    roles = record["roles"]
    st.subheader("Attention by original turn and role")
    st.plotly_chart(CF.turn_role_pair_figure(arrays["mass_original"][qi], arrays["mass_counterfactual"][qi], roles),
                    key="cf_pair", config={"displaylogo": False})
    st.caption("Masked observations keep their turn (role `placeholder`); refined ones show as `refined`. "
               "Markers count with the message they delimit (seed 002 convention).")
    st.plotly_chart(CF.redistribution_figure(changed, q["redistribution"]), key="cf_red",
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
            own = act.get("own") if isinstance(act.get("own"), dict) else None
            if own:
                st.caption(f"own tools: {own['original'].get('action')} → {own['counterfactual'].get('action')}"
                           + ("" if own.get("parseable_both") else " (not parseable on both sides: no change counted)"))
            c1, c2 = st.columns(2)
            c1.markdown("**original**")
            c1.text(act["original"]["text"])
            c2.markdown("**counterfactual**")
            c2.text(act["counterfactual"]["text"])
    lp = record.get("logprob")
    if lp:
        st.caption(f"log p of the recorded step (teacher-forced, per token): original {lp['original']['mean']:.3f}, "
                   f"counterfactual {lp['counterfactual']['mean']:.3f} "
                   f"({lp['counterfactual']['mean'] - lp['original']['mean']:+.3f})")
