"""Paired flip analysis (seed 000 appendix A.5): do shallow surface features of an item's search results
predict whether a model's decision flips between the agentic and observer framings, and in which direction?

A flip is a should_research item decided correctly in exactly one of the two framings; the inertia direction
is "correct as observer, wrong as agent". Every analysis exists twice: over every paired item (an
unparseable reply counts as wrong, the paper's rule) and, with ``parseable_both=True``, over the items
whose replies are parseable in both framings (a flip is then a change of decision, not of format).
Three tests, as in A.5:

- ``auc_flip_occurrence`` / ``auc_flip_direction``: cross-validated AUC of an L2 logistic regression on the
  18 :data:`~attnprobe.studies.ibis.features.FEATURE_NAMES` (``stats.grouped_cv_auc``: stratified folds that
  never split a query, the mean of the per-fold AUCs as the primary number, a permutation p-value that
  moves whole query groups), each with a power note (the smallest AUC detectable at its n);
- ``feature_correlations``: Spearman correlation of each feature with the per-item agentic-vs-observer gap,
  BH- and Holm-adjusted over the features.

:func:`flip_analysis` analyses one model; :func:`pooled_flip_analysis` pools the items of several models
(the paper pools its models) with one query group per item across models, so that no item's features are
in a training fold while the same item under another model is tested.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe.stats import feature_correlations, grouped_cv_auc, power_note, rounded, wilson_ci
from attnprobe.studies.ibis.behaviour import read_decisions
from attnprobe.studies.ibis.features import FEATURE_NAMES, surface_features
from attnprobe.studies.ibis.layout import ModelFolderLayout

N_SPLITS = 5
CV = (f"StratifiedGroupKFold ({N_SPLITS} folds, fewer when the rarer class is in fewer query groups; groups "
      "shuffled with the seed) by normalised query; L2 logistic regression (C = 1) on the 18 features, standardised "
      "with the training rows' mean and SD; auc = mean of the per-fold ROC AUCs over test folds holding both "
      "classes (seed 002 D.5); auc_pooled = one AUC over all out-of-fold scores (secondary); p_value = one-sided "
      "permutation p of the fold-mean AUC, permutations moving whole query groups")
DEFINITION = ("should_research items decided in both the agentic and observer framings; flip = correct in exactly "
              "one; inertia direction = correct as observer, wrong as agent. Occurrence: all items, label flip. "
              "Direction: flipped items only, label inertia direction (1) vs reverse (0).")
DEFINITION_PARSEABLE = ("the same on the should_research items whose replies are parseable (a call) in both the agentic "
                        "and observer framings, so that a flip is a change of decision, not of format")
GAP_CORRECT = "per-item gap = correct(observer) - correct(agentic), in {-1, 0, 1}"
GAP_LOG_ODDS = ("per-item gap = log_odds_visit(agentic) - log_odds_visit(observer) (forced choice; positive = the "
                "inertia direction)")


def decision_table(decisions: Sequence[dict], *, forced_choice: bool = False) -> dict[tuple[str, str], dict]:
    """(item_id, framing) -> decision record, the input of :func:`flip_analysis`. With ``forced_choice``:
    {"correct": forced choice == expected, "lo": log_odds_visit} for the records that have one."""
    if not forced_choice:
        return {(d["item_id"], d["framing"]): d for d in decisions}
    return {(d["item_id"], d["framing"]): {"correct": d["forced_choice"]["choice"] == d["expected"],
                                           "lo": d["forced_choice"]["log_odds_visit"]}
            for d in decisions if d.get("forced_choice")}


def folder_flip_inputs(folder: Path, *, forced_choice: bool = False) -> tuple[str, dict, list]:
    """(name, decision table, items) of an IBIS model folder, for :func:`pooled_flip_analysis`; the name is
    the folder's (unique within a results root, unlike the model: one model can have a folder per
    protocol)."""
    folder = Path(folder)
    return (folder.name, decision_table(read_decisions(folder), forced_choice=forced_choice),
            ModelFolderLayout(folder).read_items())


def _query_group(item) -> str:
    return " ".join(item.query.lower().split())


def _parseable(d: dict) -> bool:
    return d.get("decision", "") != "unparseable"  # forced-choice entries always decide


def _rows(model: str, dec: dict, items, parseable_both: bool = False) -> list[dict]:
    rows = []
    for it in items:
        if it.label != "should_research" or (it.id, "agentic") not in dec or (it.id, "observer") not in dec:
            continue
        da, do = dec[(it.id, "agentic")], dec[(it.id, "observer")]
        if parseable_both and not (_parseable(da) and _parseable(do)):
            continue
        rows.append({"model": model, "item": it, "a": int(bool(da["correct"])), "o": int(bool(do["correct"])),
                     "lo": (da["lo"] - do["lo"]) if "lo" in da and "lo" in do else None})
    return rows


def _round_auc(r: dict) -> dict:
    for k in ("auc", "auc_mean_over_folds", "auc_pooled"):
        if k in r:
            r[k] = rounded(r[k])
    if "auc_per_fold" in r:
        r["auc_per_fold"] = [rounded(a) for a in r["auc_per_fold"]]
    if r.get("p_value") is not None:
        r["p_value"] = rounded(r["p_value"], 6)
    return r


def _analyse(rows: list[dict], *, seed: int, n_perm: int, unit: str = "items", parseable_both: bool = False
             ) -> dict[str, Any]:
    a = np.asarray([r["a"] for r in rows], dtype=int)
    o = np.asarray([r["o"] for r in rows], dtype=int)
    flip = (a != o).astype(int)
    inertia = ((o == 1) & (a == 0)).astype(int)
    feats = {}
    for r in rows:
        feats.setdefault(r["item"].id, surface_features(r["item"]))
    X = np.stack([feats[r["item"].id] for r in rows])
    groups = [_query_group(r["item"]) for r in rows]
    n_flip, n_inertia = int(flip.sum()), int(inertia.sum())
    res: dict[str, Any] = {"n_items": len(rows), "n_flips": n_flip, "inertia_direction": n_inertia,
                           "share_inertia_direction": rounded(n_inertia / n_flip if n_flip else float("nan"))}
    if n_flip:
        lo, hi = wilson_ci(n_inertia, n_flip)
        res["share_ci95_wilson"] = [rounded(lo), rounded(hi)]
    occ = grouped_cv_auc(X, flip, groups, n_splits=N_SPLITS, n_perm=n_perm, seed=seed)
    occ["power"] = power_note(n_flip, len(rows) - n_flip, positives="flips", negatives=f"{unit} without a flip")
    fl = np.flatnonzero(flip)
    drc = grouped_cv_auc(X[fl], inertia[fl], [groups[i] for i in fl], n_splits=N_SPLITS, n_perm=n_perm, seed=seed)
    drc["power"] = power_note(n_inertia, n_flip - n_inertia, positives="flips in the inertia direction",
                              negatives="reverse flips")
    res["auc_flip_occurrence"] = _round_auc(occ)
    res["auc_flip_direction"] = _round_auc(drc)
    # per-item gap (the mean over models when pooled), one row per item: item-level features, item-level units
    log_odds = all(r["lo"] is not None for r in rows)
    gaps: dict[str, list[float]] = {}
    for r in rows:
        gaps.setdefault(r["item"].id, []).append(r["lo"] if log_odds else r["o"] - r["a"])
    ids = list(gaps)
    fc = feature_correlations(np.stack([feats[i] for i in ids]), [float(np.mean(gaps[i])) for i in ids],
                              FEATURE_NAMES)
    fc["gap"] = GAP_LOG_ODDS if log_odds else GAP_CORRECT
    res["feature_correlations"] = fc
    res["features"] = list(FEATURE_NAMES)
    res["definition"] = DEFINITION_PARSEABLE if parseable_both else DEFINITION
    if parseable_both:
        res["parseable_both"] = True
    res["cv"] = CV
    return res


def flip_analysis(dec, items, *, n_boot: int, seed: int, n_perm: int, parseable_both: bool = False
                  ) -> dict[str, Any]:
    """Paired flips agentic vs observer on should_research for one model (paper appendix A.5).

    ``dec``: (item_id, framing) -> {"correct": ...} and, for the forced choice, "lo" (log_odds_visit),
    which then defines the per-item gap. ``parseable_both``: only items whose ``decision`` is parseable
    in both framings (forced-choice entries always are). ``n_boot`` is unused (the share's interval is
    Wilson's); it is kept so that every metrics function takes the same arguments."""
    del n_boot
    rows = _rows("", dec, items, parseable_both)
    if not rows:
        return {"n_items": 0, **({"parseable_both": True} if parseable_both else {})}
    return _analyse(rows, seed=seed, n_perm=n_perm, parseable_both=parseable_both)


def pooled_flip_analysis(models: Sequence[tuple[str, dict, Sequence]], *, seed: int = 0,
                         n_perm: int = 200, parseable_both: bool = False) -> dict[str, Any]:
    """The flip analysis over the items of several models together: ``models`` holds (name, dec, items)
    per model (:func:`folder_flip_inputs`). A row is one (model, item); the query group of a row is its
    item's normalised query, shared by every model, so folds keep all of an item's rows together and a
    permutation moves them together (the items' features are permuted across items). Feature correlations
    use the per-item gap averaged over the models that decided the item."""
    names = [m[0] for m in models]
    if len(set(names)) != len(names):
        raise AttnprobeError(f"pooled flip analysis: model names must be distinct (got {names})")
    rows = [r for name, dec, items in models for r in _rows(name, dec, items, parseable_both)]
    first: dict[str, tuple[str, dict]] = {}
    for r in rows:
        name, d = first.setdefault(r["item"].id, (r["model"], r["item"].to_dict()))
        if d != r["item"].to_dict():
            raise AttnprobeError(f"pooled flip analysis: item {r['item'].id!r} differs between {name} and "
                                 f"{r['model']} (pool only runs of the same items file)")
    per_model = {}
    for name in names:
        mr = [r for r in rows if r["model"] == name]
        n_flip = sum(r["a"] != r["o"] for r in mr)
        n_inertia = sum(r["o"] == 1 and r["a"] == 0 for r in mr)
        per_model[name] = {"n_items": len(mr), "n_flips": n_flip, "inertia_direction": n_inertia,
                           "share_inertia_direction": rounded(n_inertia / n_flip if n_flip else float("nan"))}
    out: dict[str, Any] = {"models": names, "n_models": len(names), "per_model": per_model}
    if not rows:
        return {**out, "n_items": 0, "n_rows": 0}
    res = _analyse(rows, seed=seed, n_perm=n_perm, unit="(model, item) rows", parseable_both=parseable_both)
    res["n_rows"] = res.pop("n_items")
    res["n_items"] = len({r["item"].id for r in rows})
    res["pooling"] = ("one row per (model, item); query groups = the item's normalised query across all models "
                      "(an item never sits in a training and a test fold at once); the power notes count rows, "
                      "which are not independent across models, so they are optimistic")
    return {**out, **res}
