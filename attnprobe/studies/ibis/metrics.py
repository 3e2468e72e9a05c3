"""metrics.json of one IBIS model folder: pure functions over decisions and attention arrays.

``compute_metrics(folder)`` reads items.jsonl, decisions.jsonl, run.json and (when present)
attention.json/attention.safetensors and returns the dict that ``report.write_report`` writes to
metrics.json (docs/ibis.md section 4).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe.io import read_records
from attnprobe.studies.ibis.behaviour import DECISIONS, read_decisions
from attnprobe.studies.ibis.framings import FRAMINGS
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
    lo, hi = bootstrap_ci(lambda u, v, axis: v.mean(axis) - u.mean(axis), xa, xb, n_boot=n_boot, seed=seed)
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
    if index.get("protocol", "matched") == "paper":
        # The paper's observer never shows the query: an own-vs-external query gap has nothing to compare.
        reason = "paper protocol: the observer framing shows no query; run --protocol matched for this gap"
        out["attentional_gap"] = {"gap": None, "ci95": [None, None], "reason": reason}
        out["query_tokens_gap"] = {"gap": None, "ci95": [None, None], "reason": reason}
        out.update(_layer_and_head_gaps(arrays, cats, layers, sel, ("results", "reminder", "task"), ("results",),
                                        n_boot=n_boot, seed=seed, top_k=top_k))
        return out
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
    out.update(_layer_and_head_gaps(arrays, cats, layers, sel, ("query", "results", "reminder", "task"),
                                    ("query", "results"), n_boot=n_boot, seed=seed, top_k=top_k))
    return out


def _layer_and_head_gaps(arrays, cats, layers, sel, layer_cats, head_cats, *, n_boot: int, seed: int,
                         top_k: int) -> dict[str, Any]:
    """Agentic minus observer per layer (with CIs) and the top heads, for the given categories."""
    out: dict[str, Any] = {}
    per_layer = {}
    for cat in layer_cats:
        ci_ = cats.index(cat)
        dl = (arrays["mass.agentic"][sel, ci_] - arrays["mass.observer"][sel, ci_]).mean(axis=2)  # [N, L]
        lo, hi = bootstrap_mean_ci(dl, n_boot=n_boot, seed=seed)
        per_layer[cat] = {"gap": [_r(v) for v in dl.mean(0)], "lo": [_r(v) for v in lo], "hi": [_r(v) for v in hi]}
    out["per_layer_gap"] = per_layer
    heads = {}
    for cat in head_cats:
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
        "format_version": 1, "model": run.get("model", folder.name), "protocol": run.get("protocol", "matched"),
        "folder": str(folder),
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
    m["errors_logged"] = len(read_records(errors, torn_tail="skip", missing_ok=True))
    return m
