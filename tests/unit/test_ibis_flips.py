"""The paired flip analysis (seed 000 appendix A.5) on hand-built items whose answers are known: a surface
feature that determines the flips is found (AUC 1, smallest permutation p, a BH-significant correlation),
the inertia counts and shares are exact, and pooling across models keeps an item's rows in one group."""

from __future__ import annotations

import pytest

from attnprobe.errors import AttnprobeError
from attnprobe.studies.ibis.features import FEATURE_NAMES
from attnprobe.studies.ibis.flips import decision_table, flip_analysis, folder_flip_inputs, pooled_flip_analysis
from attnprobe.studies.ibis.items import IbisItem

N_PERM = 19  # smallest attainable p = 1 / 20


def _item(k: int, n_results: int, wiki: bool, label: str = "should_research") -> IbisItem:
    host = "en.wikipedia.org/wiki" if wiki else f"site{k}.com/page"
    results = [{"title": f"Title {k} {j}", "url": f"https://{host}/{k}_{j}", "snippet": f"Snippet {k} {j} words."}
               for j in range(n_results)]
    return IbisItem(id=f"i{k:02d}", task=f"Task number {k}?", query=f"query {k}", results=results, label=label)


def _synthetic():
    """24 should_research items: the 12 with 4 results flip, the 12 with 2 do not; among the flips the 8 whose
    results are Wikipedia pages flip in the inertia direction (observer right, agent wrong), the other 4
    in reverse. Plus 2 should_visit_page items, which the analysis ignores."""
    items, dec = [], {}
    for k in range(24):
        flips, inertia = k < 12, k < 8
        it = _item(k, 4 if flips else 2, wiki=inertia)
        items.append(it)
        o, a = (1, 0) if inertia else (0, 1) if flips else (k % 2, k % 2)
        # forced-choice log-odds(visit), negative exactly when correct (web_search); agentic - observer:
        # +3 on inertia flips, -2 on reverse flips, 0 on stable items
        lo_o, lo_a = (-1.0, 2.0) if inertia else (1.0, -1.0) if flips else (1.0 - 2 * o, 1.0 - 2 * o)
        dec[(it.id, "observer")] = {"correct": bool(o), "lo": lo_o}
        dec[(it.id, "agentic")] = {"correct": bool(a), "lo": lo_a}
    for k in (24, 25):
        it = _item(k, 3, wiki=False, label="should_visit_page")
        items.append(it)
        dec[(it.id, "observer")] = dec[(it.id, "agentic")] = {"correct": True}
    return items, dec


def test_a_feature_that_determines_the_flips_is_found():
    items, dec = _synthetic()
    free = {k: {"correct": v["correct"]} for k, v in dec.items()}  # free generation: no log-odds
    fl = flip_analysis(free, items, n_boot=10, seed=0, n_perm=N_PERM)
    assert fl["n_items"] == 24 and fl["n_flips"] == 12 and fl["inertia_direction"] == 8
    assert fl["share_inertia_direction"] == pytest.approx(8 / 12, abs=1e-4)
    assert fl["features"] == list(FEATURE_NAMES) and "StratifiedGroupKFold" in fl["cv"] and fl["definition"]
    occ, drc = fl["auc_flip_occurrence"], fl["auc_flip_direction"]
    # n_results alone separates flips from non-flips, share_wikipedia the two directions
    assert occ["auc"] == occ["auc_mean_over_folds"] == 1.0 and occ["p_value"] == pytest.approx(1 / (N_PERM + 1))
    assert occ["n_splits"] == 5 and len(occ["auc_per_fold"]) == 5 and occ["auc_pooled"] >= 0.95
    assert drc["auc"] == 1.0 and drc["p_value"] == pytest.approx(1 / (N_PERM + 1))
    assert drc["n"] == 12 and drc["n_positive"] == 8 and drc["n_negative"] == 4
    assert drc["n_splits"] == 4 and drc["folds_note"].startswith("n_splits reduced from 5 to 4")
    assert occ["power"]["n_positive"] == 12 and occ["power"]["n_negative"] == 12
    assert 0.5 < occ["power"]["min_detectable_auc"] < drc["power"]["min_detectable_auc"] < 1  # fewer rows: less power
    assert drc["power"]["sentence"].startswith("with 8 flips in the inertia direction and 4 reverse flips, only an AUC")
    # the per-item gap correct(observer) - correct(agentic) is +1 exactly on the Wikipedia items
    fc = fl["feature_correlations"]
    assert fc["gap"].startswith("per-item gap = correct(observer) - correct(agentic)") and fc["n_items"] == 24
    by = {r["feature"]: r for r in fc["features"]}
    assert by["share_wikipedia"]["spearman_rho"] > 0.8 and by["share_wikipedia"]["p_bh"] < 0.01
    assert fc["n_significant_after_correction"] >= 1 and by["n_results"]["p_value"] is not None
    assert by["query_words"]["spearman_rho"] is None  # every query has 2 words: constant, not tested


def test_forced_choice_gap_is_the_log_odds_difference():
    items, dec = _synthetic()
    fc = flip_analysis(dec, items, n_boot=10, seed=0, n_perm=3)["feature_correlations"]
    assert fc["gap"].startswith("per-item gap = log_odds_visit(agentic) - log_odds_visit(observer)")
    # +3 / 0 / -2 ranks the items as the free-generation gap +1 / 0 / -1 does: the same Spearman rho
    free = {k: {"correct": v["correct"]} for k, v in dec.items()}
    fr = flip_analysis(free, items, n_boot=10, seed=0, n_perm=3)["feature_correlations"]
    assert fr["gap"].startswith("per-item gap = correct(observer)")
    assert [r["spearman_rho"] for r in fc["features"]] == [r["spearman_rho"] for r in fr["features"]]
    assert {r["feature"]: r for r in fc["features"]}["share_wikipedia"]["spearman_rho"] > 0.8


def test_decision_table_for_free_generation_and_forced_choice():
    recs = [{"item_id": "a", "framing": "agentic", "correct": False, "expected": "web_search",
             "forced_choice": {"choice": "web_search", "log_odds_visit": -0.7}},
            {"item_id": "a", "framing": "observer", "correct": True, "expected": "web_search"}]
    assert decision_table(recs)[("a", "observer")]["correct"] is True
    fc = decision_table(recs, forced_choice=True)
    assert fc == {("a", "agentic"): {"correct": True, "lo": -0.7}}


def test_counts_on_six_items_and_too_few_reverse_flips():
    items, dec = [], {}
    pattern = [(1, 0), (1, 0), (1, 0), (0, 1), (1, 1), (0, 0)]  # 3 inertia flips, 1 reverse, 2 stable
    for k, (o, a) in enumerate(pattern):
        items.append(_item(k, 2 + k % 2, wiki=False))
        dec[(items[-1].id, "observer")] = {"correct": bool(o)}
        dec[(items[-1].id, "agentic")] = {"correct": bool(a)}
    fl = flip_analysis(dec, items, n_boot=100, seed=0, n_perm=5)
    assert fl["n_flips"] == 4 and fl["inertia_direction"] == 3 and fl["share_inertia_direction"] == 0.75
    assert fl["share_ci95_wilson"] == [0.3006, 0.9544]  # Wilson 3/4
    assert fl["auc_flip_direction"]["auc"] is None  # only 1 reverse flip: reported, not computed
    assert fl["auc_flip_direction"]["reason"] == "needs at least 2 examples of each class (got 3 positive, 1 negative)"
    assert flip_analysis({}, items, n_boot=1, seed=0, n_perm=1) == {"n_items": 0}


def test_pooled_analysis_keeps_an_items_rows_in_one_group():
    items, dec = _synthetic()
    # a second model: the same items, no flips at all
    calm = {k: {"correct": True} for k in dec}
    pooled = pooled_flip_analysis([("m1", dec, items), ("m2", calm, items)], seed=0, n_perm=N_PERM)
    assert pooled["models"] == ["m1", "m2"] and pooled["n_rows"] == 48 and pooled["n_items"] == 24
    assert pooled["per_model"]["m1"] == {"n_items": 24, "n_flips": 12, "inertia_direction": 8,
                                         "share_inertia_direction": 0.6667}
    assert pooled["per_model"]["m2"]["n_flips"] == 0 and pooled["per_model"]["m2"]["share_inertia_direction"] is None
    occ = pooled["auc_flip_occurrence"]
    assert occ["n"] == 48 and occ["n_groups"] == 24  # one group per item across the two models
    assert occ["permutation"].startswith("features are constant within each query group")
    assert occ["auc"] > 0.7 and pooled["n_flips"] == 12
    assert occ["power"]["sentence"].startswith("with 12 flips and 36 (model, item) rows without a flip")
    # the per-item gap is averaged over the models: +1/2 on the Wikipedia items
    assert pooled["feature_correlations"]["n_items"] == 24
    with pytest.raises(AttnprobeError, match="distinct"):
        pooled_flip_analysis([("m", dec, items), ("m", dec, items)])
    other = [_item(k, 3, wiki=False) if k == 0 else it for k, it in enumerate(items)]
    with pytest.raises(AttnprobeError, match="item 'i00' differs between m1 and m2"):
        pooled_flip_analysis([("m1", dec, items), ("m2", dec, other)])


def test_folder_inputs_and_pooled_analysis_of_saved_runs(tmp_path):
    import json

    items, dec = _synthetic()
    for name in ("a__paper", "b__paper"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "items.jsonl").write_text("".join(json.dumps(it.to_dict()) + "\n" for it in items))
        (folder / "decisions.jsonl").write_text("".join(
            json.dumps({"item_id": i, "framing": f, "correct": v["correct"], "expected": "web_search",
                        "forced_choice": {"choice": "visit_page" if v["lo"] > 0 else "web_search",
                                          "log_odds_visit": v["lo"]} if "lo" in v else None}) + "\n"
            for (i, f), v in dec.items()))
    inputs = [folder_flip_inputs(tmp_path / n) for n in ("a__paper", "b__paper")]
    assert [m[0] for m in inputs] == ["a__paper", "b__paper"] and inputs[0][1][("i00", "agentic")]["correct"] is False
    pooled = pooled_flip_analysis(inputs, seed=0, n_perm=3)
    assert pooled["n_rows"] == 48 and pooled["n_flips"] == 24 and pooled["inertia_direction"] == 16
    fc_inputs = [folder_flip_inputs(tmp_path / n, forced_choice=True) for n in ("a__paper", "b__paper")]
    assert fc_inputs[0][1][("i00", "agentic")] == {"correct": False, "lo": 2.0}
