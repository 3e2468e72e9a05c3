"""metrics.json of one IBIS model folder: pure functions over decisions and attention arrays.

``compute_metrics(folder)`` reads items.jsonl, decisions.jsonl, run.json and (when present)
attention.json/attention.safetensors and returns the dict that ``report.write_report`` writes to
metrics.json (docs/ibis.md section 4).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe.io import read_records
from attnprobe.stats import bootstrap_ci, bootstrap_mean_ci, mcnemar_exact, wilson_ci
from attnprobe.stats import rounded as _r
from attnprobe.studies.ibis.behaviour import DECISIONS, read_decisions, record_generation
from attnprobe.studies.ibis.flips import decision_table, flip_analysis
from attnprobe.studies.ibis.framings import COPY_CONTROL_TOOL, FRAMINGS
from attnprobe.studies.ibis.items import HEADLINE_LABELS, LABELS
from attnprobe.studies.ibis.layout import ModelFolderLayout
from attnprobe.studies.ibis.position import position_control, position_inputs

SUBSETS = ("should_research", "should_visit_page", "headline", "should_return_answer")
ATT_SUBSETS = ("headline", "should_research", "should_visit_page")
# Ours, not the seeds': below this many pairs (items), or with fewer than half of them parseable in both
# framings, a CI is printed with a small-sample warning (a percentile bootstrap over a handful of 0/1
# pairs collapses to [0, 0]; issue 22). 30 = one subset of the shipped item set.
SMALL_SAMPLE_N = 30


def sample_warning(n: int, parseable: int | None = None, what: str = "parseable in both framings") -> str | None:
    """The small-sample warning for a statistic over ``n`` pairs (items), ``parseable`` of them parseable
    in both framings (None: the readout always decides); None when the sample is large enough."""
    few = n < SMALL_SAMPLE_N
    unparsed = parseable is not None and 2 * parseable < n
    if not (few or unparsed):
        return None
    parts = [f"n = {n}" + (f" < {SMALL_SAMPLE_N}" if few else "")]
    if parseable is not None:
        parts.append(f"{parseable} of {n} {what}")
    return "small sample (" + ", ".join(parts) + "): the CI and p-value are not reliable"


def _parseable(d: dict) -> bool:
    """A record (or forced-choice entry, which always decides) with a parsed primary decision."""
    return d.get("decision", "") != "unparseable"


def _in_subset(label: str, subset: str) -> bool:
    return label in HEADLINE_LABELS if subset == "headline" else label == subset


def _paired(dec: dict, items, a: str, b: str, subset: str, key: str = "correct", parseable_both: bool = False):
    ids = [it.id for it in items if _in_subset(it.label, subset) and (it.id, a) in dec and (it.id, b) in dec]
    if parseable_both:
        ids = [i for i in ids if _parseable(dec[(i, a)]) and _parseable(dec[(i, b)])]
    xa = np.asarray([dec[(i, a)][key] for i in ids], dtype=float)
    xb = np.asarray([dec[(i, b)][key] for i in ids], dtype=float)
    return ids, xa, xb


def paired_gap(dec, items, a: str, b: str, subset: str, n_boot: int, seed: int, *, key: str = "correct",
               parseable_both: bool = False, parse_key: str = "decision") -> dict[str, Any]:
    """Accuracy of ``b`` minus accuracy of ``a`` on the items both framings decided, with CI and McNemar.

    ``key``: the correctness field (``correct`` = the primary call-only readout, ``correct_prose`` =
    the secondary one); ``parseable_both``: only items whose decisions (``parse_key``) are parseable in
    both framings. Every entry counts its pairs parseable in both framings and carries the small-sample
    ``warning`` (:func:`sample_warning`) when it applies."""
    view = {k: {**v, "decision": v.get(parse_key, v.get("decision"))} for k, v in dec.items()} \
        if parse_key != "decision" else dec
    ids, xa, xb = _paired(view, items, a, b, subset, key, parseable_both)
    all_ids = _paired(view, items, a, b, subset, key)[0]
    n_both = sum(_parseable(view[(i, a)]) and _parseable(view[(i, b)]) for i in all_ids)
    if not ids:
        return {"subset": subset, "n_pairs": 0, "n_parseable_both": n_both, "gap": None,
                "warning": sample_warning(0, n_both)}
    b_only = int(((xb == 1) & (xa == 0)).sum())
    a_only = int(((xa == 1) & (xb == 0)).sum())
    lo, hi = bootstrap_ci(lambda u, v, axis: v.mean(axis) - u.mean(axis), xa, xb, n_boot=n_boot, seed=seed)
    n_both = len(ids) if parseable_both else n_both
    out = {"subset": subset, "n_pairs": len(ids), f"accuracy_{a}": _r(xa.mean()), f"accuracy_{b}": _r(xb.mean()),
           "gap": _r(xb.mean() - xa.mean()), "ci95": [_r(lo), _r(hi)],
           f"correct_only_{b}": b_only, f"correct_only_{a}": a_only, "mcnemar_p": _r(mcnemar_exact(b_only, a_only), 6),
           "n_parseable_both": n_both}
    warn = sample_warning(len(ids), n_both)
    if warn:
        out["warning"] = warn
    unp = {f: sum(not _parseable(view[(i, f)]) for i in ids) for f in (a, b)}
    out["unparseable"] = unp
    dead = [f for f in (a, b) if unp[f] == len(ids)]
    if dead:  # issue 26: e.g. direct - agentic with every agentic reply unparseable
        out["format_only"] = (f"every {' and every '.join(dead)} reply is unparseable ({len(ids)} of {len(ids)}): "
                              f"this gap compares whether each framing's reply format parses (scored as wrong when "
                              f"not), not what the framings differ in")
    return out


def behaviour_metrics(items, decisions: list[dict], *, n_boot: int, seed: int, n_perm: int) -> dict[str, Any]:
    # a record without the secondary readout (a minimal or external one) has one readout for both
    dec = {(d["item_id"], d["framing"]): {**d, **{f"{k}_prose": d.get(f"{k}_prose", d.get(k))
                                                  for k in ("decision", "method", "correct")}} for d in decisions}
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
            kp = sum(bool(d["correct_prose"]) for d in rs)
            acc[fr][sub] = {
                "n": n, "correct": k, "accuracy": _r(k / n), "ci95_wilson": [_r(v) for v in wilson_ci(k, n)],
                "unparseable": n - len(parse), "unparseable_rate": _r((n - len(parse)) / n),
                "accuracy_among_parseable": _r(sum(bool(d["correct"]) for d in parse) / len(parse)) if parse else None,
                "decisions": {c: sum(d["decision"] == c for d in rs) for c in DECISIONS},
                # the secondary readout (calls, then prose): labelled, never the headline
                "prose": {"correct": kp, "accuracy": _r(kp / n),
                          "unparseable": sum(d["decision_prose"] == "unparseable" for d in rs),
                          "decisions": {c: sum(d["decision_prose"] == c for d in rs) for c in DECISIONS}},
            }
            warn = sample_warning(n, len(parse), "parseable")
            if warn:
                acc[fr][sub]["warning"] = warn
    out: dict[str, Any] = {"readout": READOUT, "framings": framings, "accuracy": acc, "parse_methods": methods,
                           "unparseable_total": sum(d["decision"] == "unparseable" for d in dec.values()),
                           "unparseable_total_prose": sum(d["decision_prose"] == "unparseable" for d in dec.values()),
                           "decisions_total": len(dec)}
    if "agentic" in framings and "observer" in framings:
        g = paired_gap(dec, items, "agentic", "observer", "should_research", n_boot, seed)
        g["definition"] = "observer accuracy - agentic accuracy on should_research (paired items)"
        out["inertia_gap"] = g
        gp = paired_gap(dec, items, "agentic", "observer", "should_research", n_boot, seed, parseable_both=True)
        gp["definition"] = "the same on the items whose replies are parseable (a call) in both framings"
        out["inertia_gap_parseable_both"] = gp
        gs = paired_gap(dec, items, "agentic", "observer", "should_research", n_boot, seed, key="correct_prose",
                        parse_key="decision_prose")
        gs["definition"] = ("SECONDARY readout (calls, then a tool named in prose or an intent phrase): observer - "
                            "agentic accuracy on should_research")
        out["prose_readout"] = {"inertia_gap": gs, "parse_methods": {
            fr: _count(d["method_prose"] for (i, f), d in dec.items() if f == fr and i in label_of) for fr in framings}}
        out["secondary_gaps"] = {
            "observer_minus_agentic_should_visit_page": paired_gap(dec, items, "agentic", "observer",
                                                                   "should_visit_page", n_boot, seed)}
        if "direct" in framings:
            out["secondary_gaps"]["direct_minus_agentic_should_research"] = paired_gap(
                dec, items, "agentic", "direct", "should_research", n_boot, seed)
            out["secondary_gaps"]["direct_minus_agentic_should_visit_page"] = paired_gap(
                dec, items, "agentic", "direct", "should_visit_page", n_boot, seed)
        out["flips"] = flip_analysis(dec, items, n_boot=n_boot, seed=seed, n_perm=n_perm)
        out["flips_parseable_both"] = flip_analysis(dec, items, n_boot=n_boot, seed=seed, n_perm=n_perm,
                                                    parseable_both=True)
    fc = forced_choice_metrics(items, dec, framings, n_boot=n_boot, seed=seed, n_perm=n_perm)
    if fc:
        out["forced_choice"] = fc
    return out


READOUT = ("primary: call-only (the tool the reply calls, structured or in any call syntax; seed 000 Table 7 "
           "scores 'calling the web_search tool'); unparseable = wrong. Secondary: prose_readout (calls, then prose "
           "mentions and intent phrases)")


def _count(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def forced_choice_metrics(items, dec, framings, *, n_boot: int, seed: int, n_perm: int = 200) -> dict[str, Any] | None:
    """The same analyses on the forced choice (log-probability of each tool name), when recorded."""
    fdec = decision_table([d for d in dec.values() if d.get("forced_choice")], forced_choice=True)
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
        "definition": "SECONDARY readout. choice = the tool whose name has the higher log-probability after the "
                      "prompt + '{\"name\": \"' (no generation, so no unparseable cases); log_odds_visit = "
                      "logP(visit_page) - logP(web_search). See copy_control: the prefix can be completed by copying "
                      "the tool name of the model's own earlier call",
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
        control = copy_control_metrics(items, dec, fdec, g, n_boot=n_boot, seed=seed)
        if control:
            out["copy_control"] = control
    return out


def copy_control_metrics(items, dec, fdec, gap: dict, *, n_boot: int, seed: int) -> dict[str, Any] | None:
    """The forced-choice gap again with the agentic framing's own call renamed (``forced_choice_control``).

    The readout's prefix ``{"name": "`` can be completed by copying the tool name of the call the model
    made itself; the control removes that name from the own call. If the gap moves by more than the
    half-width of its CI, part of it is copying and the report says so."""
    cdec = {(i, "agentic"): {"correct": d["forced_choice_control"]["choice"] == d["expected"],
                             "lo": d["forced_choice_control"]["log_odds_visit"]}
            for (i, f), d in dec.items() if f == "agentic" and d.get("forced_choice_control")}
    if not cdec:
        return None
    both = {**{k: v for k, v in fdec.items() if k[1] == "observer"}, **cdec}
    g2 = paired_gap(both, items, "agentic", "observer", "should_research", n_boot, seed)
    g2["definition"] = "observer - agentic forced-choice accuracy on should_research, the own call renamed"
    ids = [i for (i, _f) in cdec if (i, "agentic") in fdec]
    shift = np.asarray([fdec[(i, "agentic")]["lo"] - cdec[(i, "agentic")]["lo"] for i in ids])
    lo, hi = bootstrap_mean_ci(shift, n_boot=n_boot, seed=seed)
    sr = [i for i in ids if any(it.id == i and it.label == "should_research" for it in items)]
    lo_sr = [fdec[(i, "agentic")]["lo"] for i in sr]
    lo_sr_c = [cdec[(i, "agentic")]["lo"] for i in sr]
    out: dict[str, Any] = {
        "definition": "forced choice with the agentic framing's own earlier call renamed to "
                      f"{COPY_CONTROL_TOOL!r} (the option names then appear only in the system prompt and tool list "
                      "that every framing shares)",
        "inertia_gap": g2,
        "log_odds_visit_agentic_should_research": {"original": _r(np.mean(lo_sr)) if sr else None,
                                                   "renamed": _r(np.mean(lo_sr_c)) if sr else None, "n": len(sr)},
        "log_odds_shift_original_minus_renamed": {"n": len(ids), "mean": _r(shift.mean()), "ci95": [_r(lo), _r(hi)],
                                                  "definition": "per agentic item: log_odds_visit with the own call "
                                                                "as is minus with it renamed"},
    }
    if gap.get("gap") is not None and g2.get("gap") is not None and None not in gap.get("ci95", [None]):
        half = (gap["ci95"][1] - gap["ci95"][0]) / 2
        moved = abs(g2["gap"] - gap["gap"])
        out["gap_moved_by"] = _r(moved)
        out["moves_gap_beyond_ci"] = bool(moved > half)
        if moved > half:
            out["warning"] = (f"renaming the own call moves the forced-choice gap from {gap['gap']:+.3f} to "
                              f"{g2['gap']:+.3f} (more than the half-width {half:.3f} of its CI): part of the forced-"
                              "choice gap is copying of the tool name from the model's own call")
    return out


PRIMARY_GAP = ("decision-token attention mass on the query's own tokens in the agentic framing (the query argument "
               "of the model's own web_search call) minus on the same tokens shown as external text in the observer "
               "framing (matched protocol: identical token ids, so the gap is length-matched); mean over layers, "
               "heads and headline items")
WHOLE_CALL_GAP = ("SECONDARY, not length-matched: mass on the whole own call (query + call syntax, ~{call} tokens) in "
                  "the agentic framing minus mass on the {query}-token query in the observer framing. A longer span "
                  "collects more mass whatever its owner; see the per-token columns")


def _gap_entry(a: np.ndarray, o: np.ndarray, *, n_boot: int, seed: int, nd: int = 4) -> dict[str, Any]:
    """Paired agentic - observer gap of per-item values (already averaged over layers and heads)."""
    d = a - o
    lo, hi = bootstrap_mean_ci(d, n_boot=n_boot, seed=seed)
    return {"agentic": _r(a.mean(), nd), "observer": _r(o.mean(), nd), "gap": _r(d.mean(), nd),
            "ci95": [_r(lo, nd), _r(hi, nd)], "share_items_positive": _r((d > 0).mean())}


def attention_metrics(index: dict, arrays: dict, *, n_boot: int, seed: int, top_k: int = 10) -> dict[str, Any]:
    labels = np.asarray(index["labels"])
    cats = index["categories"]
    framings = index["framings"]
    layers = index["layers"]
    out: dict[str, Any] = {"n_items": len(labels), "categories": cats, "framings": framings, "layers": layers,
                           "num_heads": index["num_heads"], "renderings": index.get("renderings")}
    if "tokens.agentic" not in arrays:
        raise AttnprobeError("attention.safetensors predates the length-controlled gap (no token counts); rerun "
                             "'attnprobe ibis capture --force'")
    if "agentic" not in framings or "observer" not in framings:
        return out
    mass = {fr: arrays[f"mass.{fr}"].astype(np.float64) for fr in framings}  # [N, C, L, H]
    ntok = {fr: arrays[f"tokens.{fr}"].astype(np.float64) for fr in framings}  # [N, C]
    by_cat: dict[str, Any] = {}
    for sub in ATT_SUBSETS:
        sel = np.asarray([_in_subset(lb, sub) for lb in labels])
        if not sel.any():
            continue
        by_cat[sub] = {"n": int(sel.sum())}
        for ci, cat in enumerate(cats):
            entry: dict[str, Any] = {fr: _r(mass[fr][sel, ci].mean()) for fr in framings}
            entry["tokens"] = {fr: _r(ntok[fr][sel, ci].mean(), 2) for fr in framings}
            entry["per_token"] = {fr: _r(_per_token(mass[fr][sel, ci].mean(axis=(1, 2)), ntok[fr][sel, ci]), 6)
                                  for fr in framings}
            d = mass["agentic"][sel, ci].mean(axis=(1, 2)) - mass["observer"][sel, ci].mean(axis=(1, 2))
            lo, hi = bootstrap_mean_ci(d, n_boot=n_boot, seed=seed)
            entry.update({"gap_agentic_minus_observer": _r(d.mean()), "ci95": [_r(lo), _r(hi)]})
            by_cat[sub][cat] = entry
    out["by_category"] = by_cat
    sel = np.asarray([_in_subset(lb, "headline") for lb in labels])
    if index.get("protocol", "matched") == "paper":
        # The paper's observer never shows the query: an own-vs-external query gap has nothing to compare.
        reason = "paper protocol: the observer framing shows no query; run --protocol matched for this gap"
        out["attentional_gap"] = {"measure": "query_tokens", "gap": None, "ci95": [None, None], "reason": reason}
        out["whole_call_gap"] = {"measure": "whole_call", "gap": None, "ci95": [None, None], "reason": reason}
        out.update(_layer_and_head_gaps(arrays, cats, layers, sel, ("results", "reminder", "task"), ("results",),
                                        n_boot=n_boot, seed=seed, top_k=top_k))
        return out
    qi, ki = cats.index("query"), cats.index("call")
    qa, qo = mass["agentic"][sel, qi].mean(axis=(1, 2)), mass["observer"][sel, qi].mean(axis=(1, 2))
    na, no = ntok["agentic"][sel, qi], ntok["observer"][sel, qi]
    primary = {"measure": "query_tokens", "definition": PRIMARY_GAP, "n": int(sel.sum()),
               **({"warning": w} if (w := sample_warning(int(sel.sum()))) else {}),
               **_gap_entry(qa, qo, n_boot=n_boot, seed=seed),
               "query_tokens": {"agentic": _r(na.mean(), 2), "observer": _r(no.mean(), 2)},
               "length_matched": bool(np.array_equal(na, no))}
    primary["per_token"] = _gap_entry(qa / np.maximum(na, 1), qo / np.maximum(no, 1), n_boot=n_boot, seed=seed,
                                      nd=6)
    out["attentional_gap"] = primary
    wa = qa + mass["agentic"][sel, ki].mean(axis=(1, 2))
    nwa = na + ntok["agentic"][sel, ki]
    whole = {"measure": "whole_call", "definition": WHOLE_CALL_GAP.format(call=round(float(nwa.mean())),
                                                                         query=round(float(no.mean()))),
             "n": int(sel.sum()), **_gap_entry(wa, qo, n_boot=n_boot, seed=seed),
             "tokens": {"agentic_whole_call": _r(nwa.mean(), 2), "observer_query": _r(no.mean(), 2)}}
    whole["per_token"] = _gap_entry(wa / np.maximum(nwa, 1), qo / np.maximum(no, 1), n_boot=n_boot, seed=seed,
                                    nd=6)
    out["whole_call_gap"] = whole
    out.update(_layer_and_head_gaps(arrays, cats, layers, sel, ("query", "results", "reminder", "task"),
                                    ("query", "results"), n_boot=n_boot, seed=seed, top_k=top_k))
    return out


def _per_token(mass_items: np.ndarray, tokens: np.ndarray) -> float:
    """Mean over items of mass / tokens (NaN when the category is empty in every item)."""
    ok = tokens > 0
    return float(np.mean(mass_items[ok] / tokens[ok])) if ok.any() else float("nan")


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


def read_run(folder: Path) -> dict:
    """A model folder's run.json (model, protocol, variant, stages), {} when there is none
    (:meth:`ModelFolderLayout.read_run`: the one reader, validated by its ``problem``)."""
    return ModelFolderLayout(Path(folder)).read_run()


def compute_metrics(folder: Path, *, n_boot: int = 10000, seed: int = 0, n_perm: int = 200) -> dict[str, Any]:
    folder = Path(folder)
    layout = ModelFolderLayout(folder)
    items = layout.read_items()
    decisions = read_decisions(folder)
    run = layout.read_run()
    m: dict[str, Any] = {
        "format_version": 1, "model": run.get("model", folder.name), "protocol": run.get("protocol", "matched"),
        "folder": str(folder),
        "n_items": len(items), "labels": {lb: sum(it.label == lb for it in items) for lb in LABELS},
        "domains": sorted({it.domain for it in items}), "bootstrap": {"n": n_boot, "seed": seed},
        "run": run,
    }
    gens = {json.dumps(record_generation(d), sort_keys=True) for d in decisions}
    m["generation"] = json.loads(next(iter(gens))) if len(gens) == 1 else ({"mixed": sorted(gens)} if gens else {})
    m["reminder"] = (run.get("reminder") or m["generation"].get("reminder")
                     or ("listing" if m["protocol"] == "paper" else "identical"))
    if decisions:
        m["behaviour"] = behaviour_metrics(items, decisions, n_boot=n_boot, seed=seed, n_perm=n_perm)
    if (attention := layout.read_attention()) is not None:
        index, arrays = attention
        m["attention"] = attention_metrics(index, arrays, n_boot=n_boot, seed=seed)
        gap = m["attention"].get("attentional_gap") or {}
        if gap.get("gap") is not None and layout.captures.is_dir():
            ids = [i for i, lb in zip(index["items"], index["labels"]) if _in_subset(lb, "headline")]
            p = position_inputs(folder, ids)
            gap["position_control"] = position_control(p["qa"], p["qo"], p["pa"], p["po"], p["da"], p["do"],
                                                       n_boot=n_boot, seed=seed, qs=p["qs"], ds=p["ds"])
    m["errors_logged"] = len(read_records(layout.errors, torn_tail="skip", missing_ok=True))
    return m
