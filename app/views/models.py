"""Models page: behavioural and attentional inertia gaps across models, with CIs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from attnprobe.results.figures import ibis_compare_figure
from attnprobe.results.formatting import format_ci
from attnprobe.studies.ibis.compare import compare_row
from attnprobe.studies.ibis.layout import METRICS_FILE, ModelFolderLayout
from attnprobe_app import common as C
from attnprobe_app import data as D

FROM_FOLDERS = f"IBIS model folders ({METRICS_FILE})"


def render(root, inv) -> None:
    st.title("Models")
    C.show_problems(inv.problems)
    sources = list(inv.compares) + ([FROM_FOLDERS] if inv.ibis else [])
    if not sources:
        C.no_data("IBIS results", "Run `attnprobe ibis all --results DIR/ibis` for each model, then "
                                  "`attnprobe compare DIR/ibis --out DIR/compare`.")
        return
    with st.sidebar:
        st.markdown("### Models")
        src = st.selectbox("source", sources, key="models_src",
                           help="a compare.json written by `attnprobe compare`, or every IBIS folder found here")
    problems = []
    if src == FROM_FOLDERS:
        rows = []
        for rel in inv.ibis:
            try:  # the study's reader of metrics.json, every path kept inside the data directory
                layout = ModelFolderLayout(Path(rel), root)
                metrics = layout.read_metrics()
                if metrics is None:
                    problems.append(f"{rel}: no {METRICS_FILE} (run `attnprobe ibis report`)")
                    continue
                rows.append(compare_row(metrics, layout.folder))
            except Exception as exc:  # noqa: BLE001 - shown to the user
                problems.append(f"{rel}: {exc}")
    else:
        try:
            rows = D.load_compare(root, src)
        except D.DataError as exc:
            st.error(str(exc))
            return
    C.show_problems(problems, "skipped")
    if not rows:
        st.info("No model has metrics yet.")
        return
    for r in rows:
        r.setdefault("model", "?")
        for k in ("inertia_gap", "inertia_gap_ci95", "attentional_gap", "attentional_gap_ci95"):
            r.setdefault(k, None)
    st.plotly_chart(ibis_compare_figure(rows), key="models_fig", config={"displaylogo": False})
    st.caption("Left: behavioural inertia gap = observer − agentic accuracy on should_research items (paired, 95% "
               "bootstrap CI). Right: attentional gap (length-matched) = decision-token attention on the query's "
               "own tokens, owned by the model (agentic) − the same tokens shown as external text (observer); "
               "matched-protocol folders only (the paper's observer shows no query).")
    df = pd.DataFrame([{
        "model": r.get("model"), "variant (folder)": r.get("label"), "dtype": r.get("dtype"),
        "items": r.get("n_items"),
        "inertia gap (pp) [95% CI]": format_ci(r.get("inertia_gap"), r.get("inertia_gap_ci95"), pct=True, unit=""),
        "McNemar p": r.get("mcnemar_p"),
        "protocol": r.get("protocol"),
        "attentional gap, query tokens [95% CI]": (
            format_ci(r.get("attentional_gap"), r.get("attentional_gap_ci95"))
            if r.get("attentional_gap_measure") == "query_tokens" else "n/a"),
        "forced-choice gap (pp), own call renamed": format_ci(r.get("forced_choice_control_gap"),
                                                              r.get("forced_choice_control_gap_ci95"), pct=True,
                                                              unit=""),
        "results attention gap [95% CI]": format_ci(r.get("results_attention_gap"),
                                                    r.get("results_attention_gap_ci95")),
        "flips in inertia direction": r.get("share_inertia_direction"),
        "unparseable": f"{r.get('unparseable')}/{r.get('decisions')}",
        **{k: r.get(k) for k in r if k.startswith("acc_")}} for r in rows])
    C.paginate(df, key="models_table")
