"""Metrics and reports for one model folder, and the cross-model comparison.

``compute_metrics(folder)`` reads items.jsonl, decisions.jsonl and (when present) attention.*
and returns the metrics dict written to metrics.json; ``write_report`` adds report.md and a
self-contained report.html (plotly); ``compare`` builds the side-by-side table and figure.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe.io import atomic_write_text
from attnprobe.studies.ibis.behaviour import DECISIONS, read_decisions
from attnprobe.studies.ibis.framings import CATEGORIES, FRAMINGS
from attnprobe.studies.ibis.items import HEADLINE_LABELS, LABELS, load_items
from attnprobe.studies.ibis.stats import (
    FEATURE_NAMES,
    bootstrap_ci,
    bootstrap_mean_ci,
    grouped_cv_auc,
    mcnemar_exact,
    surface_features,
    wilson_ci,
)

SUBSETS = ("should_research", "should_visit_page", "headline", "should_return_answer")
ATT_SUBSETS = ("headline", "should_research", "should_visit_page")


def _r(x, nd=4):
    if x is None:
        return None
    if isinstance(x, np.ndarray) and x.size == 1:
        x = float(x.reshape(-1)[0])
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return None if math.isnan(float(x)) else round(float(x), nd)
    return x


def _in_subset(label: str, subset: str) -> bool:
    return label in HEADLINE_LABELS if subset == "headline" else label == subset


def _paired(dec: dict, items, a: str, b: str, subset: str):
    ids = [it.id for it in items if _in_subset(it.label, subset) and (it.id, a) in dec and (it.id, b) in dec]
    xa = np.asarray([dec[(i, a)]["correct"] for i in ids], dtype=float)
    xb = np.asarray([dec[(i, b)]["correct"] for i in ids], dtype=float)
    return ids, xa, xb


def paired_gap(dec, items, a: str, b: str, subset: str, n_boot: int, seed: int) -> dict[str, Any]:
    """Accuracy of ``b`` minus accuracy of ``a`` on the items both framings decided, with CI and McNemar."""
    ids, xa, xb = _paired(dec, items, a, b, subset)
    if not ids:
        return {"subset": subset, "n_pairs": 0, "gap": None}
    b_only = int(((xb == 1) & (xa == 0)).sum())
    a_only = int(((xa == 1) & (xb == 0)).sum())
    lo, hi = bootstrap_ci(lambda u, v: v.mean() - u.mean(), xa, xb, n_boot=n_boot, seed=seed)
    return {"subset": subset, "n_pairs": len(ids), f"accuracy_{a}": _r(xa.mean()), f"accuracy_{b}": _r(xb.mean()),
            "gap": _r(xb.mean() - xa.mean()), "ci95": [_r(lo), _r(hi)],
            f"correct_only_{b}": b_only, f"correct_only_{a}": a_only, "mcnemar_p": _r(mcnemar_exact(b_only, a_only), 6)}


def behaviour_metrics(items, decisions: list[dict], *, n_boot: int, seed: int, n_perm: int) -> dict[str, Any]:
    dec = {(d["item_id"], d["framing"]): d for d in decisions}
    label_of = {it.id: it.label for it in items}
    framings = [f for f in FRAMINGS if any(k[1] == f for k in dec)]
    acc: dict[str, Any] = {}
    methods: dict[str, Any] = {}
    for fr in framings:
        acc[fr] = {}
        recs = [d for (i, f), d in dec.items() if f == fr and i in label_of]
        methods[fr] = {}
        for d in recs:
            methods[fr][d["method"]] = methods[fr].get(d["method"], 0) + 1
        for sub in SUBSETS:
            rs = [d for d in recs if _in_subset(label_of[d["item_id"]], sub)]
            if not rs:
                continue
            k, n = sum(bool(d["correct"]) for d in rs), len(rs)
            parse = [d for d in rs if d["decision"] != "unparseable"]
            acc[fr][sub] = {
                "n": n, "correct": k, "accuracy": _r(k / n), "ci95_wilson": [_r(v) for v in wilson_ci(k, n)],
                "unparseable": n - len(parse),
                "accuracy_among_parseable": _r(sum(bool(d["correct"]) for d in parse) / len(parse)) if parse else None,
                "decisions": {c: sum(d["decision"] == c for d in rs) for c in DECISIONS},
            }
    out: dict[str, Any] = {"framings": framings, "accuracy": acc, "parse_methods": methods,
                           "unparseable_total": sum(d["decision"] == "unparseable" for d in dec.values()),
                           "decisions_total": len(dec)}
    if "agentic" in framings and "observer" in framings:
        g = paired_gap(dec, items, "agentic", "observer", "should_research", n_boot, seed)
        g["definition"] = "observer accuracy - agentic accuracy on should_research (paired items)"
        out["inertia_gap"] = g
        out["secondary_gaps"] = {
            "observer_minus_agentic_should_visit_page": paired_gap(dec, items, "agentic", "observer",
                                                                   "should_visit_page", n_boot, seed)}
        if "direct" in framings:
            out["secondary_gaps"]["direct_minus_agentic_should_research"] = paired_gap(
                dec, items, "agentic", "direct", "should_research", n_boot, seed)
            out["secondary_gaps"]["direct_minus_agentic_should_visit_page"] = paired_gap(
                dec, items, "agentic", "direct", "should_visit_page", n_boot, seed)
        out["flips"] = flip_analysis(dec, items, n_boot=n_boot, seed=seed, n_perm=n_perm)
    fc = forced_choice_metrics(items, dec, framings, n_boot=n_boot, seed=seed, n_perm=n_perm)
    if fc:
        out["forced_choice"] = fc
    return out


def forced_choice_metrics(items, dec, framings, *, n_boot: int, seed: int, n_perm: int = 200) -> dict[str, Any] | None:
    """The same analyses on the forced choice (log-probability of each tool name), when recorded."""
    fdec = {k: {"correct": d["forced_choice"]["choice"] == d["expected"], "lo": d["forced_choice"]["log_odds_visit"]}
            for k, d in dec.items() if d.get("forced_choice")}
    if not fdec:
        return None
    label_of = {it.id: it.label for it in items}
    acc = {}
    for fr in framings:
        acc[fr] = {}
        for sub in ("should_research", "should_visit_page", "headline"):
            rs = [v for (i, f), v in fdec.items() if f == fr and i in label_of and _in_subset(label_of[i], sub)]
            if rs:
                k, n = sum(v["correct"] for v in rs), len(rs)
                acc[fr][sub] = {"n": n, "correct": k, "accuracy": _r(k / n),
                                "ci95_wilson": [_r(v) for v in wilson_ci(k, n)],
                                "mean_log_odds_visit": _r(float(np.mean([v["lo"] for v in rs])))}
    out: dict[str, Any] = {
        "definition": "choice = the tool whose name has the higher log-probability after the prompt + '{\"name\": \"' "
                      "(no generation, so no unparseable cases); log_odds_visit = logP(visit_page) - logP(web_search)",
        "accuracy": acc}
    if "agentic" in framings and "observer" in framings:
        g = paired_gap(fdec, items, "agentic", "observer", "should_research", n_boot, seed)
        g["definition"] = "observer - agentic forced-choice accuracy on should_research"
        out["inertia_gap"] = g
        out["flips"] = flip_analysis(fdec, items, n_boot=n_boot, seed=seed, n_perm=n_perm)
        shifts = {}
        for sub in ("should_research", "should_visit_page", "headline"):
            ids = [it.id for it in items if _in_subset(it.label, sub) and (it.id, "agentic") in fdec
                   and (it.id, "observer") in fdec]
            if not ids:
                continue
            d = np.asarray([fdec[(i, "agentic")]["lo"] - fdec[(i, "observer")]["lo"] for i in ids])
            lo, hi = bootstrap_mean_ci(d, n_boot=n_boot, seed=seed)
            shifts[sub] = {"n": len(ids), "mean": _r(d.mean()), "ci95": [_r(lo), _r(hi)],
                           "share_positive": _r((d > 0).mean())}
        out["log_odds_shift_agentic_minus_observer"] = {
            "definition": "per-item log_odds_visit(agentic) - log_odds_visit(observer); positive = owning the search "
                          "pushes the model toward visiting a page (the inertia direction)", **shifts}
    return out


def flip_analysis(dec, items, *, n_boot: int, seed: int, n_perm: int) -> dict[str, Any]:
    """Paired flips agentic vs observer on should_research (paper appendix A.5)."""
    rs = [it for it in items if it.label == "should_research" and (it.id, "agentic") in dec
          and (it.id, "observer") in dec]
    if not rs:
        return {"n_items": 0}
    a = np.asarray([dec[(it.id, "agentic")]["correct"] for it in rs], dtype=int)
    o = np.asarray([dec[(it.id, "observer")]["correct"] for it in rs], dtype=int)
    flip = (a != o).astype(int)
    inertia = ((o == 1) & (a == 0)).astype(int)
    X = np.stack([surface_features(it) for it in rs])
    groups = [" ".join(it.query.lower().split()) for it in rs]
    n_flip = int(flip.sum())
    share = inertia.sum() / n_flip if n_flip else float("nan")
    res: dict[str, Any] = {"n_items": len(rs), "n_flips": n_flip, "inertia_direction": int(inertia.sum()),
                           "share_inertia_direction": _r(share)}
    if n_flip:
        lo, hi = wilson_ci(int(inertia.sum()), n_flip)
        res["share_ci95_wilson"] = [_r(lo), _r(hi)]
    res["auc_flip_occurrence"] = grouped_cv_auc(X, flip, groups, n_perm=n_perm, seed=seed)
    fl = np.flatnonzero(flip)
    res["auc_flip_direction"] = grouped_cv_auc(X[fl], inertia[fl], [groups[i] for i in fl], n_perm=n_perm, seed=seed)
    for k in ("auc_flip_occurrence", "auc_flip_direction"):
        res[k]["auc"] = _r(res[k]["auc"])
    res["features"] = list(FEATURE_NAMES)
    res["cv"] = "GroupKFold by normalised query, L2 logistic regression on standardised features, pooled out-of-fold AUC"
    return res


def attention_metrics(index: dict, arrays: dict, *, n_boot: int, seed: int, top_k: int = 10) -> dict[str, Any]:
    labels = np.asarray(index["labels"])
    cats = index["categories"]
    framings = index["framings"]
    layers = index["layers"]
    out: dict[str, Any] = {"n_items": len(labels), "categories": cats, "framings": framings, "layers": layers,
                           "num_heads": index["num_heads"], "renderings": index.get("renderings")}
    if "agentic" not in framings or "observer" not in framings:
        return out
    by_cat: dict[str, Any] = {}
    for sub in ATT_SUBSETS:
        sel = np.asarray([_in_subset(lb, sub) for lb in labels])
        if not sel.any():
            continue
        by_cat[sub] = {"n": int(sel.sum())}
        for ci, cat in enumerate(cats):
            entry = {fr: _r(arrays[f"mass.{fr}"][sel, ci].mean()) for fr in framings}
            d = arrays["mass.agentic"][sel, ci].mean(axis=(1, 2)) - arrays["mass.observer"][sel, ci].mean(axis=(1, 2))
            lo, hi = bootstrap_mean_ci(d, n_boot=n_boot, seed=seed)
            entry.update({"gap_agentic_minus_observer": _r(d.mean()), "ci95": [_r(lo), _r(hi)]})
            by_cat[sub][cat] = entry
    out["by_category"] = by_cat
    sel = np.asarray([_in_subset(lb, "headline") for lb in labels])
    qi = cats.index("query")
    d_item = (arrays["mass.agentic"][sel, qi] - arrays["mass.observer"][sel, qi])  # [N, L, H]
    dm = d_item.mean(axis=(1, 2))
    lo, hi = bootstrap_mean_ci(dm, n_boot=n_boot, seed=seed)
    out["attentional_gap"] = {
        "definition": "decision-token attention mass on the own web_search call (agentic) minus on the same query "
                      "shown as external text (observer); mean over layers, heads and headline items",
        "n": int(sel.sum()), "agentic_own_call": _r(arrays["mass.agentic"][sel, qi].mean()),
        "observer_query": _r(arrays["mass.observer"][sel, qi].mean()), "gap": _r(dm.mean()), "ci95": [_r(lo), _r(hi)],
        "share_items_positive": _r((dm > 0).mean())}
    qa, qo = arrays["query_tokens.agentic"][sel], arrays["query_tokens.observer"][sel]
    lo, hi = bootstrap_mean_ci(qa - qo, n_boot=n_boot, seed=seed)
    out["query_tokens_gap"] = {
        "definition": "mass on the query string's own tokens (same tokens in both framings; mean over layers and "
                      "heads): agentic minus observer", "agentic": _r(qa.mean()), "observer": _r(qo.mean()),
        "gap": _r((qa - qo).mean()), "ci95": [_r(lo), _r(hi)]}
    per_layer = {}
    for cat in ("query", "results", "reminder", "task"):
        ci_ = cats.index(cat)
        dl = (arrays["mass.agentic"][sel, ci_] - arrays["mass.observer"][sel, ci_]).mean(axis=2)  # [N, L]
        lo, hi = bootstrap_mean_ci(dl, n_boot=n_boot, seed=seed)
        per_layer[cat] = {"gap": [_r(v) for v in dl.mean(0)], "lo": [_r(v) for v in lo], "hi": [_r(v) for v in hi]}
    out["per_layer_gap"] = per_layer
    heads = {}
    for cat in ("query", "results"):
        ci_ = cats.index(cat)
        dh = arrays["mass.agentic"][sel, ci_] - arrays["mass.observer"][sel, ci_]  # [N, L, H]
        mean = dh.mean(0)
        lo, hi = bootstrap_mean_ci(dh, n_boot=min(n_boot, 2000), seed=seed)
        abs_total = np.abs(mean).sum()
        order = np.argsort(-np.abs(mean), axis=None)[:top_k]
        rows = []
        for flat in order:
            li, h = np.unravel_index(flat, mean.shape)
            rows.append({"layer": int(layers[li]), "head": int(h), "gap": _r(mean[li, h]),
                         "ci95": [_r(lo[li, h]), _r(hi[li, h])],
                         "agentic": _r(arrays["mass.agentic"][sel, ci_, li, h].mean()),
                         "observer": _r(arrays["mass.observer"][sel, ci_, li, h].mean()),
                         "share_of_abs_gap": _r(abs(mean[li, h]) / abs_total) if abs_total else None})
        top_abs = float(sum(abs(mean[np.unravel_index(f, mean.shape)]) for f in order))
        heads[cat] = {"top": rows, "top_k_share_of_abs_gap": _r(top_abs / abs_total) if abs_total else None,
                      "mean_gap": _r(float(mean.mean())), "share_heads_positive": _r(float((mean > 0).mean())),
                      "gap_matrix": [[_r(v, 5) for v in row] for row in mean]}
    out["heads"] = heads
    return out


def compute_metrics(folder: Path, *, n_boot: int = 10000, seed: int = 0, n_perm: int = 200) -> dict[str, Any]:
    folder = Path(folder)
    items_path = folder / "items.jsonl"
    if not items_path.is_file():
        raise AttnprobeError(f"{folder}: no items.jsonl (not an IBIS model folder; run 'attnprobe ibis run' first)")
    items = load_items(items_path)
    decisions = read_decisions(folder / "decisions.jsonl")
    run = json.loads((folder / "run.json").read_text()) if (folder / "run.json").is_file() else {}
    m: dict[str, Any] = {
        "format_version": 1, "model": run.get("model", folder.name), "folder": str(folder),
        "n_items": len(items), "labels": {lb: sum(it.label == lb for it in items) for lb in LABELS},
        "domains": sorted({it.domain for it in items}), "bootstrap": {"n": n_boot, "seed": seed},
        "run": run,
    }
    if decisions:
        m["behaviour"] = behaviour_metrics(items, decisions, n_boot=n_boot, seed=seed, n_perm=n_perm)
    if (folder / "attention.json").is_file():
        from attnprobe.studies.ibis.attention import load_attention

        index, arrays = load_attention(folder)
        m["attention"] = attention_metrics(index, arrays, n_boot=n_boot, seed=seed)
    errors = folder / "errors.jsonl"
    m["errors_logged"] = sum(1 for ln in errors.read_text().splitlines() if ln.strip()) if errors.is_file() else 0
    return m


# ------------------------------------------------------------------ text and HTML
def _fmt_ci(entry: dict | None, key="gap", pct=True) -> str:
    if not entry or entry.get(key) is None:
        return "n/a"
    f = (lambda v: f"{100 * v:+.1f}") if pct else (lambda v: f"{v:+.4f}")
    lo, hi = entry.get("ci95", [None, None])
    ci = f" [{f(lo)}, {f(hi)}]" if lo is not None else ""
    return f"{f(entry[key])}{ci}" + (" pp" if pct else "")


def markdown_report(m: dict) -> str:
    L = [f"# IBIS report: {m['model']}", "",
         f"Items: {m['n_items']} ({', '.join(f'{k}: {v}' for k, v in m['labels'].items())}); "
         f"domains: {', '.join(m['domains'])}. Bootstrap: {m['bootstrap']['n']} resamples, seed {m['bootstrap']['seed']}.",
         ""]
    b = m.get("behaviour")
    if b:
        L += ["## Behaviour (next action)", "",
              "Accuracy = share of items whose next action is the labelled one (`web_search` for should_research, "
              "`visit_page` for should_visit_page); unparseable replies count as wrong and are listed.", "",
              "| framing | subset | n | accuracy | 95% CI (Wilson) | unparseable | web_search | visit_page | answer |",
              "|---|---|---|---|---|---|---|---|---|"]
        for fr, subs in b["accuracy"].items():
            for sub, e in subs.items():
                d = e["decisions"]
                L.append(f"| {fr} | {sub} | {e['n']} | {100 * e['accuracy']:.1f}% | "
                         f"{100 * e['ci95_wilson'][0]:.1f}-{100 * e['ci95_wilson'][1]:.1f}% | {e['unparseable']} | "
                         f"{d['web_search']} | {d['visit_page']} | {d['answer']} |")
        L += ["", f"Unparseable replies: {b['unparseable_total']} of {b['decisions_total']}. "
                  f"Parse methods: {json.dumps(b['parse_methods'])}.", ""]
        g = b.get("inertia_gap")
        if g and g.get("gap") is not None:
            L += [f"**Inertia gap** (observer - agentic accuracy on should_research, n={g['n_pairs']} pairs): "
                  f"{_fmt_ci(g)}; McNemar exact p = {g['mcnemar_p']} "
                  f"(observer-only correct {g['correct_only_observer']}, agentic-only correct "
                  f"{g['correct_only_agentic']}).", ""]
            for k, v in b.get("secondary_gaps", {}).items():
                if v.get("gap") is not None:
                    L.append(f"- {k}: {_fmt_ci(v)}, McNemar p = {v['mcnemar_p']}")
            fl = b.get("flips", {})
            L += ["", f"Flips (should_research): {fl.get('n_flips')} of {fl.get('n_items')} items; share in the "
                      f"inertia direction: {fl.get('share_inertia_direction')} {fl.get('share_ci95_wilson', '')}."]
            for k in ("auc_flip_occurrence", "auc_flip_direction"):
                e = fl.get(k, {})
                L.append(f"- {k}: AUC = {e.get('auc')} (permutation p = {e.get('p_value')}; n = {e.get('n')}"
                         + (f"; {e['reason']}" if e.get("reason") else "") + ")")
            L.append("")
        fc = b.get("forced_choice")
        if fc:
            L += ["### Forced choice (log-probability of each tool name; every item decided)", "",
                  "| framing | subset | n | accuracy | 95% CI | mean log-odds visit |", "|---|---|---|---|---|---|"]
            for fr, subs in fc["accuracy"].items():
                for sub, e in subs.items():
                    L.append(f"| {fr} | {sub} | {e['n']} | {100 * e['accuracy']:.1f}% | "
                             f"{100 * e['ci95_wilson'][0]:.1f}-{100 * e['ci95_wilson'][1]:.1f}% | "
                             f"{e['mean_log_odds_visit']:+.3f} |")
            g = fc.get("inertia_gap")
            if g and g.get("gap") is not None:
                L += ["", f"Forced-choice inertia gap (observer - agentic, should_research, n={g['n_pairs']}): "
                          f"{_fmt_ci(g)}; McNemar exact p = {g['mcnemar_p']} (observer-only "
                          f"{g['correct_only_observer']}, agentic-only {g['correct_only_agentic']})."]
            fl = fc.get("flips") or {}
            if fl.get("n_items"):
                L.append(f"- forced-choice flips (should_research): {fl['n_flips']} of {fl['n_items']}; share in the "
                         f"inertia direction {fl['share_inertia_direction']} {fl.get('share_ci95_wilson', '')}; "
                         f"surface-feature AUC occurrence {fl['auc_flip_occurrence'].get('auc')} "
                         f"(p {fl['auc_flip_occurrence'].get('p_value')}), direction "
                         f"{fl['auc_flip_direction'].get('auc')} (p {fl['auc_flip_direction'].get('p_value')}"
                         + (f"; {fl['auc_flip_direction']['reason']}" if fl['auc_flip_direction'].get('reason') else "")
                         + ")")
            for sub, e in (fc.get("log_odds_shift_agentic_minus_observer") or {}).items():
                if isinstance(e, dict):
                    L.append(f"- log-odds(visit) shift agentic - observer, {sub} (n={e['n']}): {e['mean']:+.3f} "
                             f"[{e['ci95'][0]:+.3f}, {e['ci95'][1]:+.3f}], positive in {e['share_positive']}")
            L.append("")
    a = m.get("attention")
    if a and "attentional_gap" in a:
        g = a["attentional_gap"]
        L += ["## Attention at the decision position", "",
              f"**Attentional gap** (own call in agentic minus the same query shown externally in observer; "
              f"n={g['n']}): {_fmt_ci(g, pct=False)} (agentic own call {g['agentic_own_call']}, observer query "
              f"{g['observer_query']}; positive in {g['share_items_positive']} of items).",
              f"Query tokens only (length-matched): {_fmt_ci(a['query_tokens_gap'], pct=False)}.", "",
              "| subset | category | " + " | ".join(a["framings"]) + " | agentic - observer [95% CI] |",
              "|---|---|" + "---|" * len(a["framings"]) + "---|"]
        for sub, cats in a["by_category"].items():
            for cat in CATEGORIES:
                e = cats[cat]
                L.append(f"| {sub} | {cat} | " + " | ".join(f"{e[fr]:.4f}" for fr in a["framings"])
                         + f" | {_fmt_ci(e, key='gap_agentic_minus_observer', pct=False)} |")
        L += ["", "Heads carrying most of the own-call vs external-query difference (agentic - observer):", "",
              "| layer | head | gap [95% CI] | agentic | observer | share of summed abs gap |", "|---|---|---|---|---|---|"]
        for h in a["heads"]["query"]["top"]:
            L.append(f"| {h['layer']} | {h['head']} | {h['gap']:+.4f} [{h['ci95'][0]:+.4f}, {h['ci95'][1]:+.4f}] | "
                     f"{h['agentic']:.4f} | {h['observer']:.4f} | {h['share_of_abs_gap']} |")
        hq = a["heads"]["query"]
        L += ["", f"The top {len(hq['top'])} of {len(hq['gap_matrix']) * len(hq['gap_matrix'][0])} heads carry "
                  f"{hq['top_k_share_of_abs_gap']} of the summed absolute head gap; {hq['share_heads_positive']} of "
                  f"heads attend more to the own call than to the external query.", ""]
    if m.get("errors_logged"):
        L += [f"Errors logged in errors.jsonl: {m['errors_logged']} (items are retried on the next run).", ""]
    return "\n".join(L)


def html_report(m: dict, *, plotlyjs: str | bool = True) -> str:
    import plotly.graph_objects as go

    figs = []
    b = m.get("behaviour")
    if b:
        fig = go.Figure()
        for fr, subs in b["accuracy"].items():
            xs = [s for s in ("should_research", "should_visit_page", "headline") if s in subs]
            ys = [subs[s]["accuracy"] for s in xs]
            fig.add_bar(name=fr, x=xs, y=ys, error_y=dict(type="data", symmetric=False,
                        array=[subs[s]["ci95_wilson"][1] - subs[s]["accuracy"] for s in xs],
                        arrayminus=[subs[s]["accuracy"] - subs[s]["ci95_wilson"][0] for s in xs]))
        fig.update_layout(title="Next-action accuracy per framing (95% Wilson CI)", barmode="group",
                          yaxis=dict(range=[0, 1], title="accuracy"))
        figs.append(fig)
        fig = go.Figure()
        for dec in DECISIONS:
            xs, ys = [], []
            for fr, subs in b["accuracy"].items():
                for s in ("should_research", "should_visit_page"):
                    if s in subs:
                        xs.append(f"{fr}<br>{s}")
                        ys.append(subs[s]["decisions"][dec] / subs[s]["n"])
            fig.add_bar(name=dec, x=xs, y=ys)
        fig.update_layout(title="What the model did (share of decisions)", barmode="stack")
        figs.append(fig)
    a = m.get("attention")
    if a and "by_category" in a:
        sub = a["by_category"]["headline"]
        fig = go.Figure()
        for fr in a["framings"]:
            fig.add_bar(name=fr, x=list(CATEGORIES), y=[sub[c][fr] for c in CATEGORIES])
        fig.update_layout(title="Decision-token attention mass per category (mean over layers, heads, items)",
                          barmode="group")
        figs.append(fig)
        fig = go.Figure()
        for cat, e in a["per_layer_gap"].items():
            fig.add_scatter(x=a["layers"], y=e["gap"], name=cat, mode="lines+markers",
                            error_y=dict(type="data", symmetric=False,
                                         array=[h - g for h, g in zip(e["hi"], e["gap"])],
                                         arrayminus=[g - lo for g, lo in zip(e["gap"], e["lo"])]))
        fig.update_layout(title="Per-layer gap, agentic - observer (95% bootstrap CI)", xaxis_title="layer",
                          yaxis_title="attention mass difference")
        figs.append(fig)
        gm = np.asarray(a["heads"]["query"]["gap_matrix"], dtype=float)
        lim = float(np.nanmax(np.abs(gm))) or 1.0
        fig = go.Figure(go.Heatmap(z=gm.T, x=a["layers"], y=list(range(gm.shape[1])), colorscale="RdBu_r",
                                   zmin=-lim, zmax=lim, colorbar=dict(title="gap")))
        fig.update_layout(title="Own call (agentic) - external query (observer), per layer and head",
                          xaxis_title="layer", yaxis_title="head")
        figs.append(fig)
    parts = []
    for i, fig in enumerate(figs):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=plotlyjs if i == 0 else False))
    body = "\n".join(parts)
    md = html.escape(markdown_report(m))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>IBIS report: {html.escape(str(m['model']))}"
            f"</title></head><body style='font-family:sans-serif;max-width:1100px;margin:auto'>"
            f"<h1>IBIS report: {html.escape(str(m['model']))}</h1>{body}<h2>Numbers</h2><pre>{md}</pre>"
            f"</body></html>")


def write_report(folder: Path, *, n_boot: int = 10000, seed: int = 0, n_perm: int = 200,
                 plotlyjs: str | bool = True) -> dict[str, Any]:
    folder = Path(folder)
    if (folder / "captures").is_dir() and (folder / "items.jsonl").is_file():
        from attnprobe.studies.ibis.attention import aggregate

        aggregate(load_items(folder / "items.jsonl"), folder)
    m = compute_metrics(folder, n_boot=n_boot, seed=seed, n_perm=n_perm)
    atomic_write_text(folder / "metrics.json", json.dumps(m, indent=1))
    atomic_write_text(folder / "report.md", markdown_report(m))
    atomic_write_text(folder / "report.html", html_report(m, plotlyjs=plotlyjs))
    return m


# ------------------------------------------------------------------ compare
def _model_folders(paths: Sequence[Path]) -> list[Path]:
    out = []
    for p in map(Path, paths):
        if (p / "metrics.json").is_file() or (p / "items.jsonl").is_file():
            out.append(p)
        elif p.is_dir():
            out += sorted(q for q in p.iterdir() if (q / "metrics.json").is_file())
        else:
            raise AttnprobeError(f"{p}: not a folder")
    if not out:
        raise AttnprobeError("no IBIS model folders (with metrics.json) among: " + ", ".join(map(str, paths)))
    return out


def compare_rows(folders: Sequence[Path]) -> list[dict[str, Any]]:
    rows = []
    for f in _model_folders(folders):
        mp = f / "metrics.json"
        if not mp.is_file():
            raise AttnprobeError(f"{f}: no metrics.json (run 'attnprobe ibis report' first)")
        m = json.loads(mp.read_text(encoding="utf-8"))
        b, a = m.get("behaviour", {}), m.get("attention", {})
        acc = b.get("accuracy", {})
        g = b.get("inertia_gap", {})
        ag = a.get("attentional_gap", {})
        rg = a.get("by_category", {}).get("headline", {}).get("results", {})
        row = {"model": m.get("model", f.name), "folder": str(f), "n_items": m.get("n_items"),
               "inertia_gap": g.get("gap"), "inertia_gap_ci95": g.get("ci95"), "mcnemar_p": g.get("mcnemar_p"),
               "unparseable": b.get("unparseable_total"), "decisions": b.get("decisions_total"),
               "attentional_gap": ag.get("gap"), "attentional_gap_ci95": ag.get("ci95"),
               "results_attention_gap": rg.get("gap_agentic_minus_observer"), "results_attention_gap_ci95": rg.get("ci95"),
               "share_inertia_direction": b.get("flips", {}).get("share_inertia_direction"),
               "forced_choice_inertia_gap": (b.get("forced_choice") or {}).get("inertia_gap", {}).get("gap"),
               "forced_choice_inertia_gap_ci95": (b.get("forced_choice") or {}).get("inertia_gap", {}).get("ci95"),
               "forced_choice_mcnemar_p": (b.get("forced_choice") or {}).get("inertia_gap", {}).get("mcnemar_p")}
        for fr in FRAMINGS:
            for sub in ("should_research", "should_visit_page"):
                row[f"acc_{fr}_{sub}"] = acc.get(fr, {}).get(sub, {}).get("accuracy")
        rows.append(row)
    return rows


def compare_table(rows: list[dict]) -> str:
    def pct(v):
        return "n/a" if v is None else f"{100 * v:.1f}"

    def ci(v, c, scale=100.0, fmt="{:+.1f}"):
        if v is None:
            return "n/a"
        s = fmt.format(scale * v)
        return s + (f" [{fmt.format(scale * c[0])}, {fmt.format(scale * c[1])}]" if c and c[0] is not None else "")

    head = ("| model | n | research acc ag/obs/dir | visit acc ag/obs/dir | inertia gap pp [CI] | McNemar p | "
            "unparseable | forced-choice gap pp [CI] (p) | attn gap own-call vs query [CI] | attn gap results [CI] |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['n_items']} | "
            + "/".join(pct(r[f"acc_{fr}_should_research"]) for fr in FRAMINGS) + " | "
            + "/".join(pct(r[f"acc_{fr}_should_visit_page"]) for fr in FRAMINGS) + " | "
            + f"{ci(r['inertia_gap'], r['inertia_gap_ci95'])} | {r['mcnemar_p']} | {r['unparseable']}/{r['decisions']} | "
            + f"{ci(r['forced_choice_inertia_gap'], r['forced_choice_inertia_gap_ci95'])} ({r['forced_choice_mcnemar_p']}) | "
            + f"{ci(r['attentional_gap'], r['attentional_gap_ci95'], 1.0, '{:+.4f}')} | "
            + f"{ci(r['results_attention_gap'], r['results_attention_gap_ci95'], 1.0, '{:+.4f}')} |")
    return "\n".join(lines)


def compare_figure(rows: list[dict]):
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "Behavioural inertia gap (observer - agentic, should_research)",
        "Attentional gap (own call - external query, decision token)"))
    names = [r["model"] for r in rows]

    def err(vals, cis):
        up = [(c[1] - v) if v is not None and c and c[1] is not None else 0 for v, c in zip(vals, cis)]
        dn = [(v - c[0]) if v is not None and c and c[0] is not None else 0 for v, c in zip(vals, cis)]
        return dict(type="data", symmetric=False, array=up, arrayminus=dn)

    v1 = [r["inertia_gap"] for r in rows]
    fig.add_bar(x=names, y=v1, error_y=err(v1, [r["inertia_gap_ci95"] for r in rows]), name="inertia gap", row=1,
                col=1)
    v2 = [r["attentional_gap"] for r in rows]
    fig.add_bar(x=names, y=v2, error_y=err(v2, [r["attentional_gap_ci95"] for r in rows]), name="attentional gap",
                row=1, col=2)
    fig.update_yaxes(title_text="accuracy difference", row=1, col=1)
    fig.update_yaxes(title_text="attention mass difference", row=1, col=2)
    fig.update_layout(title="IBIS across models (95% bootstrap CIs)", showlegend=False)
    return fig


def compare(folders: Sequence[Path], out: Path, *, plotlyjs: str | bool = True) -> tuple[list[dict], str]:
    rows = compare_rows(folders)
    table = compare_table(rows)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "compare.json", json.dumps(rows, indent=1))
    atomic_write_text(out / "compare.md", table + "\n")
    fig = compare_figure(rows)
    atomic_write_text(out / "compare.html", (
        "<!doctype html><html><head><meta charset='utf-8'><title>IBIS compare</title></head><body "
        "style='font-family:sans-serif'>" + fig.to_html(full_html=False, include_plotlyjs=plotlyjs)
        + f"<pre>{html.escape(table)}</pre></body></html>"))
    return rows, table
