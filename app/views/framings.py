"""Framings page: agentic vs observer vs direct, for one IBIS item and aggregated over items."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from attnprobe.results import figures as F
from attnprobe.results.formatting import format_ci
from attnprobe.studies.ibis import layout as L
from attnprobe_app import common as C
from attnprobe_app import data as D

SHOWN = ("query", "results", "reminder", "task")
AGG = "all items (aggregated)"


def _fmt_gap(e: dict | None, pct: bool = True) -> tuple[str, str]:
    """(value, 'value [lo, hi] (95% CI)') for a metric tile and its caption."""
    if not e or e.get("gap") is None:
        return "n/a", ""
    ci = e.get("ci95")
    return (format_ci(e["gap"], pct=pct),
            f"{format_ci(e['gap'], ci, pct=pct)} (95% CI)" if ci and None not in ci else "")


def render(root, inv) -> None:
    st.title("Framings")
    C.show_problems(inv.problems)
    if not inv.ibis:
        C.no_data("IBIS model folders", "Run `attnprobe ibis all --results DIR/ibis` (one folder per model with "
                                        f"{L.ITEMS_FILE}, {L.DECISIONS_FILE}, {L.ATTENTION_INDEX}, "
                                        f"{L.ATTENTION_ARRAYS} and {L.METRICS_FILE}; see docs/ibis.md).")
        return
    with st.sidebar:
        st.markdown("### Framings")
        rel = st.selectbox("IBIS model folder", inv.ibis, key="fr_folder")
    try:
        ib = C.ibis(root, rel)
    except D.DataError as exc:
        st.error(f"Cannot read `{rel}`: {exc}")
        return
    C.show_problems(ib.problems, "in this folder could not be read")
    st.caption(f"model **{ib.model}** · {len(ib.items)} items · {len(ib.decisions)} decisions · "
               f"attention: {'yes' if ib.attention is not None else 'no'} · {L.METRICS_FILE}: "
               f"{'yes' if ib.metrics else 'no'} · folder `{rel}`")
    ids = [it.get("id") for it in ib.items if it.get("id")]
    with st.sidebar:
        choice = st.selectbox("item", [AGG] + ids, key=f"fr_item:{rel}")
    if choice == AGG:
        _aggregated(ib)
    else:
        _item(ib, choice)


def _item(ib: D.IbisFolder, item_id: str) -> None:
    item = next(it for it in ib.items if it.get("id") == item_id)
    st.subheader(f"Item {item_id}")
    st.markdown(f"**label** `{item.get('label')}` · **domain** {item.get('domain', '?')}")
    st.markdown(f"**Task.** {item.get('task', '')}")
    st.markdown(f"**Query.** `{item.get('query', '')}`")
    with st.expander(f"{len(item.get('results', []))} search results"):
        for r in item.get("results", []):
            st.markdown(f"- **{r.get('title', '')}** — {r.get('url', '')}  \n  {r.get('snippet', '')}")
    decs = {d["framing"]: d for d in ib.decisions if d.get("item_id") == item_id}
    st.markdown("#### Behaviour")
    if decs:
        df = pd.DataFrame([{"framing": fr, "decision": d.get("decision"), "expected": d.get("expected"),
                            "correct": "yes" if d.get("correct") else "no", "parsed by": d.get("method"),
                            "log-odds visit (forced choice)": (d.get("forced_choice") or {}).get("log_odds_visit"),
                            "reply": (d.get("raw_text") or "")[:300]} for fr, d in decs.items()])
        st.dataframe(df, hide_index=True)
    else:
        st.info("No decisions for this item yet (`attnprobe ibis run`).")
    st.markdown("#### Attention at the decision token")
    if ib.attention is None:
        st.info(f"No {L.ATTENTION_INDEX} / {L.ATTENTION_ARRAYS} in this folder (`attnprobe ibis capture`).")
        return
    idx = ib.attention_index
    if item_id not in idx["items"]:
        st.info("This item has no attention capture for every framing yet.")
        return
    i = idx["items"].index(item_id)
    cats = idx["categories"]
    vals = {fr: {c: float(ib.attention[f"mass.{fr}"][i, ci].mean()) for ci, c in enumerate(cats)}
            for fr in idx["framings"]}
    st.plotly_chart(F.framing_bars(vals, SHOWN, "mass on own action (query) / results / reminder / task "
                                                "(mean over layers and heads)"), key="item_bars",
                    config={"displaylogo": False})
    if "agentic" in idx["framings"] and "observer" in idx["framings"]:
        cat = st.radio("heads: category", SHOWN, horizontal=True, key="item_head_cat")
        ci = cats.index(cat)
        d = np.asarray(ib.attention["mass.agentic"][i, ci], dtype=float) - np.asarray(
            ib.attention["mass.observer"][i, ci], dtype=float)
        st.plotly_chart(F.head_gap_figure(d, idx["layers"], f"{cat}: agentic − observer per layer and head"),
                        key="item_heads", config={"displaylogo": False})
        order = np.argsort(-np.abs(d), axis=None)[:10]
        rows = []
        for flat in order:
            li, h = np.unravel_index(flat, d.shape)
            rows.append({"layer": idx["layers"][li], "head": int(h), "agentic − observer": d[li, h],
                         "agentic": float(ib.attention["mass.agentic"][i, ci, li, h]),
                         "observer": float(ib.attention["mass.observer"][i, ci, li, h])})
        st.markdown("Heads with the largest difference (this item)")
        st.dataframe(pd.DataFrame(rows), hide_index=True)


def _aggregated(ib: D.IbisFolder) -> None:
    m = ib.metrics
    if not m:
        st.warning(f"This folder has no {L.METRICS_FILE} yet: run `attnprobe ibis report --folder "
                   f"{ib.rel}` to compute accuracies, gaps and confidence intervals. Per-item views work already.")
        return
    b = m.get("behaviour") or {}
    st.subheader("Behaviour")
    if b:
        g = b.get("inertia_gap") or {}
        c1, c2, c3 = st.columns(3)
        v, ci = _fmt_gap(g)
        c1.metric("inertia gap (observer − agentic, should_research)", v)
        c1.caption(ci)
        c2.metric("McNemar exact p", "n/a" if g.get("mcnemar_p") is None else f"{g['mcnemar_p']:.4g}")
        c3.metric("unparseable replies", f"{b.get('unparseable_total', 0)} / {b.get('decisions_total', 0)}")
        rows = []
        for fr, subs in (b.get("accuracy") or {}).items():
            for sub, e in subs.items():
                lo, hi = (e.get("ci95_wilson") or [None, None])
                rows.append({"framing": fr, "subset": sub, "n": e.get("n"), "accuracy": e.get("accuracy"),
                             "95% CI": f"{lo:.2f}–{hi:.2f}" if lo is not None else "", "unparseable": e.get("unparseable"),
                             **{k: v for k, v in (e.get("decisions") or {}).items()}})
        C.paginate(pd.DataFrame(rows), key="acc_table")
    else:
        st.info(f"No behaviour results ({L.DECISIONS_FILE}) in this folder.")
    a = m.get("attention") or {}
    st.subheader("Attention at the decision token")
    bc = (a.get("by_category") or {})
    if not bc:
        st.info("No attention metrics (run `attnprobe ibis capture` then `attnprobe ibis report`).")
        return
    subset = st.radio("subset", list(bc), horizontal=True, key="agg_subset")
    sub = bc[subset]
    frs = [f for f in a.get("framings", []) if all(f in (sub.get(c) or {}) for c in SHOWN)]
    vals = {fr: {c: sub[c][fr] for c in SHOWN} for fr in frs}
    st.plotly_chart(F.framing_bars(vals, SHOWN, f"{subset} (n={sub.get('n')}): mean attention mass per category"),
                    key="agg_bars", config={"displaylogo": False})
    ag = a.get("attentional_gap") or {}
    c1, c2 = st.columns(2)
    v, ci = _fmt_gap(ag, pct=False)
    c1.metric("attentional gap: query tokens, own − external (length-matched)", v)
    c1.caption(ci if ag.get("gap") is not None else (ag.get("reason") or ci))
    c2.metric("items with a positive gap", "n/a" if ag.get("share_items_positive") is None
              else f"{100 * ag['share_items_positive']:.0f}%")
    wg = a.get("whole_call_gap") or {}
    if wg.get("gap") is not None:
        wv, wci = _fmt_gap(wg, pct=False)
        st.caption(f"Secondary, not length-matched: whole own call ({wg['tokens']['agentic_whole_call']} tokens) − "
                   f"external query ({wg['tokens']['observer_query']} tokens) = {wv} {wci}. A longer span collects "
                   "more mass whatever its owner.")
    gaps = pd.DataFrame([{"category": c, "agentic − observer": sub[c].get("gap_agentic_minus_observer"),
                          "95% CI": str(sub[c].get("ci95"))} for c in SHOWN if c in sub])
    st.dataframe(gaps, hide_index=True)
    heads = a.get("heads") or {}
    if heads:
        st.subheader("Heads with the largest agentic − observer difference")
        cat = st.radio("category", list(heads), horizontal=True, key="agg_head_cat")
        h = heads[cat]
        if h.get("gap_matrix"):
            st.plotly_chart(F.head_gap_figure(np.asarray(h["gap_matrix"], dtype=float), a.get("layers", []),
                                              f"{cat}: agentic − observer (headline items)"), key="agg_heads",
                            config={"displaylogo": False})
        C.paginate(pd.DataFrame(h.get("top", [])), key="heads_table")
        if h.get("top_k_share_of_total_gap") is not None:
            st.caption(f"The top {len(h.get('top', []))} heads carry {100 * h['top_k_share_of_total_gap']:.0f}% of "
                       "the total gap.")
