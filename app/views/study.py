"""Study page: the settings of one ``attnprobe study interference`` side by side (accuracy and cost with
CIs, paired comparisons with the baseline, every question's outcome) and, for a chosen question, the
agent's steps under each chosen setting with the attention of each recorded call where it was captured."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pandas as pd
import streamlit as st

from attnprobe.studies.loop.layout import CALLS_JSONL, CAPTURE, StudyLayout
from attnprobe_app import common as C
from attnprobe_app import data as D
from attnprobe_app import shaping as SH
from attnprobe_app import study_data as SD

TITLE = "Study: policies in the loop"
ATTENTION = ("every captured step", "last captured step", "none")
HOW = ("Run `attnprobe study interference QUESTIONS.jsonl --scaffold ircot --policy none --policy ircot:oq "
       "--out DIR/study` (docs/loop.md), then press **Rescan data directory**.")
FILL = ("No captures for this setting yet: `attnprobe study attention {out}` captures every recorded call "
        "(or `attnprobe capture {calls} --out {capture}` for this setting); the steps below show behaviour only.")


def _pick_study(studies: list[SD.Study]) -> SD.Study:
    labels = {s.rel: s.label for s in studies}
    rels = list(labels)
    want = st.query_params.get("study", "")
    with st.sidebar:
        st.markdown("### Study")
        rel = st.selectbox("study folder", rels, format_func=labels.get, key="study_rel",
                           index=rels.index(want) if want in rels else 0)
    return next(s for s in studies if s.rel == rel)


def render(root, inv) -> None:
    head = st.empty()  # the title names --structured-actions once the study is known (issue 37)
    head.title(TITLE)
    C.show_problems(inv.problems)
    studies, skipped = C.studies(root, inv)
    C.show_problems(skipped, "skipped")
    if not studies:
        C.no_data("interference studies", HOW)
        return
    study = _pick_study(studies)
    d = study.data
    if words := SD.structured_title(d):  # --structured-actions: another experiment than the seeds'
        head.title(TITLE + words)
    cfg = d.get("config") or {}
    boot = d.get("bootstrap") or {}
    st.caption(f"Folder `{study.rel}` · scaffold **{cfg.get('scaffold', '?')}** · model "
               f"{', '.join(map(str, d.get('models') or [])) or '?'} · scorer {d.get('scorer', '?')} · "
               f"{len(d.get('questions') or {})} of {d.get('questions_total', '?')} questions finished · "
               f"brackets: 95% bootstrap CI over questions ({boot.get('resamples', '?')} resamples)")
    for caveat in C.study_caveats(root, study):  # computed from the data (docs/loop.md, "Caveats")
        st.warning(f"Caveat: {caveat}")

    st.subheader("Settings side by side")
    C.table(SD.settings_table(study))
    st.caption("Per setting, means per question: ART = retrievals, Len. = mean prompt tokens per call, rolling "
               "input tokens = prompt tokens summed over the calls, AIT = seconds per question (docs/methods.md, "
               "\"Seeds 002 and 004 in the loop\"). A question without an answer counts as wrong.")

    st.subheader(f"Against the baseline `{study.baseline}` (same questions)")
    paired = SD.paired_table(study)
    if paired:
        C.table(paired)
        st.caption("fixed: wrong under the baseline, right under the setting; broken: the reverse. Difference: "
                   "paired-bootstrap CI; p: exact McNemar test of fixed vs broken.")
    else:
        st.info("Only the baseline was run: nothing to compare.")

    _attention_summary(root, study)

    st.subheader("Per question")
    grid = SD.outcome_grid(study)
    if not grid:
        st.info("No question has finished yet.")
        return
    C.paginate(pd.DataFrame(grid), key=f"study_grid:{study.rel}")

    st.subheader("One question, setting by setting")
    qids = [r["question"] for r in grid]
    texts = {r["question"]: r["text"] for r in grid}
    want = st.query_params.get("question", "")
    qid = st.selectbox("question", qids, index=qids.index(want) if want in qids else 0, key=f"study_q:{study.rel}",
                       format_func=lambda q: f"{q} · {texts[q][:90]}")
    others = [s for s in study.settings if s != study.baseline]
    chosen = st.multiselect("settings", study.settings, default=[study.baseline] + others[:1],
                            key=f"study_settings:{study.rel}")
    attention = st.radio("attention of the captured calls", ATTENTION, index=1, horizontal=True,
                         key="study_attention",
                         help="Each drawn step loads its capture; 'last' (the default, so the page opens fast) draws "
                              "one per setting, 'every' all of them.")
    if not chosen:
        st.info("Choose at least one setting.")
        return
    row = next(r for r in grid if r["question"] == qid)
    for col, setting in zip(st.columns(len(chosen)), chosen):
        with col:
            _setting_column(root, study, setting, qid, row[setting], attention)


def _setting_column(root, study: SD.Study, setting: str, qid: str, outcome: str, attention: str) -> None:
    answer = ((study.data.get("questions") or {}).get(qid, {}).get("answer") or {}).get(setting)
    st.markdown(f"#### `{setting}`\n{outcome}" + (f" · answer: {answer}" if answer is not None else ""))
    steps = C.study_steps(root, study, setting, qid)
    C.show_problems(steps.problems)
    if not steps.capture_folder:  # the commands name the setting's files by its layout's names (text, not read)
        out = (Path(root) / study.rel).as_posix()
        folder = f"{out}/{StudyLayout.setting_name(setting)}"
        st.info(FILL.format(out=out, calls=f"{folder}/{CALLS_JSONL}", capture=f"{folder}/{CAPTURE}"))
    if SD.has_counterfactuals(root, study, setting):
        st.caption("Counterfactuals of this setting's steps: the **Counterfactual** page.")
    if not steps.steps:
        return
    # a grid, not a Markdown table: it sits in a half-width column and scrolls sideways there
    st.dataframe(pd.DataFrame(_step_rows(steps.steps)), hide_index=True, key=f"study_steps:{setting}")
    captured = [s.step for s in steps.steps if s.capture]
    with_heatmap = set(SH.heatmap_steps(steps.steps))
    draw = {"every captured step": set(captured), "last captured step": set(captured[-1:])}.get(attention, set())
    for s in steps.steps:
        with st.expander(f"step {s.step} · {s.policy} · {s.capture_note}", expanded=s.step in draw):
            st.caption(f"sent {s.sent} messages (full history: {s.history_messages}) · tokens in {s.input_tokens}, "
                       f"out {s.output_tokens} · call `{s.call_id}`")
            if s.tool_calls:
                st.text("\n".join(s.tool_calls))  # st.code would load the 1.5 MB syntax highlighter: a third of the first draw
            if s.reply:
                st.text(s.reply)
            if s.step in draw:
                _call_attention(root, s, key=f"{setting}:{s.step}", heatmap=s.step in with_heatmap)


def _step_rows(steps: list[SD.Step]) -> list[dict]:
    """The steps table, what the policy did first (full-history message indices), so it shows unscrolled."""
    idx = lambda v: ", ".join(map(str, v)) or "–"  # noqa: E731
    return [{"step": s.step, "placeholder": idx(s.changes["placeholder"]), "refined": idx(s.changes["refined"]),
             "removed": idx(sorted(s.changes["removed"] + s.changes["calls_removed"])),
             "sent / history": f"{s.sent} / {s.history_messages if s.history_messages is not None else '?'}",
             "reply": (" ".join(s.tool_calls) or s.reply)[:120], "tokens in / out": f"{s.input_tokens} / "
             f"{s.output_tokens}", "capture": s.capture_note} for s in steps]


def heatmap_figure(hm, texts: dict, status: dict[int, str]):
    """One call's turn heatmap for reading: fixed integer axes, sequential scales where zero is white,
    observation rows of turns without an observation left blank, colour bars below the plot."""
    import numpy as np
    import plotly.graph_objects as go

    T = hm.reasoning.shape[0]
    obs = SH.observation_cells(hm.observation, [bool((t or "").strip()) for t in texts["observation"]])
    ticks = SH.turn_ticks(T, status)
    axis = dict(tickmode="array", tickvals=list(range(T)), ticktext=[str(t) for t in range(T)],
                range=[-0.5, T - 0.5], showgrid=False, zeroline=False, fixedrange=True)
    fig = go.Figure()
    for name, z, colour, x in (("reasoning", hm.reasoning, "#08519c", 0.22), ("observation", obs, "#a63603", 0.78)):
        lo, hi = SH.sequential_range(z)
        fig.add_trace(go.Heatmap(
            z=np.asarray(z, dtype=np.float32), x=list(range(T)), y=list(range(T)), name=name, zmin=lo, zmax=hi,
            colorscale=[[0, "#ffffff"], [1, colour]], hoverongaps=False,
            colorbar=dict(title=dict(text=f"past {name}", side="top"), orientation="h", x=x, y=-0.3, len=0.42,
                          thickness=10, xanchor="center", yanchor="top", nticks=4),
            hovertemplate=("step %{y} → turn %{x}" if name == "reasoning" else "step %{x} → turn %{y}") +
            f"<br>{name}: " + "%{z:.4f}<extra></extra>"))
    fig.update_layout(height=330 + 18 * min(T, 20), margin=dict(l=110, r=20, t=10, b=130), plot_bgcolor="#eeeeee",
                      xaxis=dict(title="past turn (lower) · step (upper)", constrain="domain", **axis),
                      yaxis=dict(title="step (lower) · past turn (upper)", scaleanchor="x", autorange=False,
                                 **{**axis, "range": [T - 0.5, -0.5], "ticktext": ticks}))  # rows name replaced turns
    return fig


def breakdown_figure(shares: dict[str, dict[str, float]]):
    """One stacked horizontal bar per query: the call's share of every category (:func:`SD.call_breakdown`)."""
    import plotly.graph_objects as go

    queries = list(shares)
    fig = go.Figure()
    for c in SD.CATEGORIES:
        fig.add_trace(go.Bar(y=queries, x=[shares[q][c] for q in queries], name=c.replace("_", " "), orientation="h",
                             hovertemplate="%{y}<br>" + c.replace("_", " ") + ": %{x:.1%}<extra></extra>"))
    fig.update_layout(barmode="stack", height=120 + 40 * len(queries), margin=dict(l=90, r=20, t=10, b=90),
                      xaxis=dict(title="attention share", range=[0, 1], tickformat=".0%"),
                      legend=dict(orientation="h", y=-0.5, yanchor="top", x=0, xanchor="left"))
    return fig


def _call_attention(root, s: SD.Step, key: str, heatmap: bool) -> None:
    """The Trajectory page's turn heatmap and the reply's attention per turn and role, from the capture."""
    try:
        res = C.capture(root, s.capture)
        views = C.capture_views(root, s.capture)
    except D.DataError as exc:
        st.error(f"Cannot show the capture of step {s.step}: {exc}")
        return
    status = SH.turn_status(res.segments, res.meta)
    label = SD.call_models_label(res.meta.get("model"), s.model)  # another model read the agent's context: say so
    whose = f"; {label}" if label else ""
    if not heatmap:
        st.caption(f"No turn heatmap: {SH.past_turns(res.num_turns)} past turn(s), fewer than "
                   f"{SH.HEATMAP_MIN_PAST}.")
    elif any(q.kind == "reasoning" for q in res.queries):
        st.markdown(f"**Turn heatmap of step {s.step}** ({SH.past_turns(res.num_turns)} past turns{whose})")
        st.plotly_chart(heatmap_figure(C.heatmap(root, s.capture), views["turn_texts"], status),
                        key=f"study_hm:{key}", config={"displaylogo": False})
        st.caption("Lower triangle (blue): step t (row) → turn j's reasoning; upper (orange): step t (column) → "
                   "turn j's observation (row); white = 0, grey = no value (diagonal, or a turn without an "
                   "observation). Mean of layers and heads.")
    if res.queries:  # attention.md's breakdown of this call (the same function), per query it has
        shares = SD.call_breakdown(res)
        if shares:
            st.plotly_chart(breakdown_figure(shares), key=f"study_seg:{key}", config={"displaylogo": False})
            st.caption("Attention of the call's decision token (the last token before the reply) and reasoning start "
                       "per category, as attention.md counts them (the chat template's text belongs to the message "
                       f"it delimits; token 0 to system), mean of layers and heads{whose}. "
                       f"[Open in Trajectory](?page=Trajectory&run={quote(s.capture)}) for it per turn and role.")
        if status or SH.removed_count(res.meta):
            st.caption(SH.ROLE_LEGEND)


def _attention_summary(root, study: SD.Study) -> None:
    """``attention.json`` as ``attnprobe study attention`` writes it, shown as it is (when present)."""
    try:
        summary = SD.attention_summary(root, study)
    except D.DataError as exc:
        st.error(f"Cannot show the attention summary: {exc}")
        return
    if summary is None:
        return
    if dropped := SD.attention_dropped(root, study, summary):  # study.md drops it too
        st.subheader("Attention per setting")
        st.warning(dropped)
        return
    label = SD.models_label(summary) if isinstance(summary, dict) else None  # another capture model: say whose
    st.subheader("Attention per setting" + (f" ({label})" if label else ""))
    st.caption("Written by `attnprobe study attention`: attention shares (%) of the recorded calls with at least "
               f"{summary.get('min_past', '?')} past turns (seed 002 E.5), per question the mean over its calls, "
               "then the mean over questions, with 95% bootstrap CIs over questions. Settings send contexts of "
               "different lengths: compare them by the per-token shares (1 = a category's length's worth) and the "
               "paired differences with the baseline (same question and step).")
    tables = list(SD.ATTENTION_TABLES)
    first = SD.first_table(summary)
    if first != "shares":
        st.info(f"No call has {summary.get('min_past', '?')} or more past turns: the filtered tables are empty, "
                "so the per-step table is shown first.")
    table = st.radio("table", tables, index=tables.index(first), horizontal=True, key="study_attention_table",
                     help="one table at a time keeps the page quick to draw")
    for query in ("decision", "reasoning"):
        st.markdown(f"**{SD.attention_query_label(query).capitalize()}**")
        try:
            rows = SH.key_columns_first(SD.attention_rows(summary, query, table))
            C.table(rows)
        except D.DataError as exc:
            st.error(f"Cannot show the attention summary: {exc}")
            break
    if st.toggle(f"{SD.ATTENTION_FILE} as written", value=False, key="study_attention_raw"):
        st.json(summary, expanded=2)
