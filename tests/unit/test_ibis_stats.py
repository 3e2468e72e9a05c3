"""IBIS statistics against hand-computed values (and scikit-learn/scipy when they are installed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnprobe.studies.ibis.items import IbisItem
from attnprobe.studies.ibis.report import flip_analysis, paired_gap
from attnprobe.studies.ibis.stats import (
    FEATURE_NAMES,
    bootstrap_ci,
    bootstrap_mean_ci,
    fit_logistic,
    group_kfold,
    grouped_cv_auc,
    mcnemar_exact,
    roc_auc,
    surface_features,
    wilson_ci,
)


def test_mcnemar_exact_hand_values():
    # b=6, c=1: n=7, P(X<=1) = (1 + 7) / 2^7 = 0.0625 -> two-sided 0.125
    assert mcnemar_exact(6, 1) == pytest.approx(0.125)
    assert mcnemar_exact(1, 6) == pytest.approx(0.125)
    # b=0, c=4: P(X<=0) = 1/16 -> 0.125
    assert mcnemar_exact(0, 4) == pytest.approx(0.125)
    # b=10, c=0: 2 / 1024
    assert mcnemar_exact(10, 0) == pytest.approx(2 / 1024)
    # balanced: capped at 1; no discordant pairs: 1
    assert mcnemar_exact(5, 5) == 1.0 and mcnemar_exact(0, 0) == 1.0
    # b=9, c=2: P(X<=2) = (1 + 11 + 55) / 2048
    assert mcnemar_exact(9, 2) == pytest.approx(2 * 67 / 2048)


def test_mcnemar_matches_scipy_binomtest():
    scipy_stats = pytest.importorskip("scipy.stats")
    for b, c in [(3, 12), (7, 7), (20, 9), (1, 0)]:
        assert mcnemar_exact(b, c) == pytest.approx(scipy_stats.binomtest(b, b + c, 0.5).pvalue)


def test_wilson_hand_values():
    lo, hi = wilson_ci(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = wilson_ci(5, 10)  # symmetric around 0.5: 0.2366 .. 0.7634
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    assert all(math.isnan(v) for v in wilson_ci(0, 0))


def test_roc_auc_hand_values():
    assert roc_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.75)
    assert roc_auc([0, 1], [0.5, 0.5]) == pytest.approx(0.5)  # a tie counts one half
    assert roc_auc([1, 1, 0], [3, 2, 1]) == 1.0
    assert math.isnan(roc_auc([1, 1], [0.2, 0.3]))


def test_bootstrap_ci_constant_and_reproducible():
    x = np.ones(20)
    assert bootstrap_ci(lambda a: a.mean(), x, n_boot=200) == (1.0, 1.0)
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 50).astype(float)
    a = bootstrap_ci(lambda v: v.mean(), y, n_boot=2000, seed=3)
    b = bootstrap_ci(lambda v: v.mean(), y, n_boot=2000, seed=3)
    assert a == b
    lo, hi = a
    se = y.std() / math.sqrt(len(y))  # percentile CI ~ mean +- 1.96 SE
    assert lo == pytest.approx(y.mean() - 1.96 * se, abs=0.03) and hi == pytest.approx(y.mean() + 1.96 * se, abs=0.03)
    lo2, hi2 = bootstrap_mean_ci(y, n_boot=2000, seed=3)
    assert float(lo2) == pytest.approx(lo, abs=0.02) and float(hi2) == pytest.approx(hi, abs=0.02)


def test_paired_gap_and_mcnemar_on_decisions():
    items = [IbisItem(id=f"i{k}", task="t", query=f"q{k}", results=[{"title": "a", "url": "https://a", "snippet": "s"}],
                      label="should_research") for k in range(4)]
    obs = [1, 1, 1, 0]
    ag = [0, 0, 1, 0]
    dec = {}
    for it, o, a in zip(items, obs, ag):
        dec[(it.id, "observer")] = {"correct": bool(o)}
        dec[(it.id, "agentic")] = {"correct": bool(a)}
    g = paired_gap(dec, items, "agentic", "observer", "should_research", 500, 0)
    assert g["gap"] == pytest.approx(0.5) and g["n_pairs"] == 4
    assert g["correct_only_observer"] == 2 and g["correct_only_agentic"] == 0
    assert g["mcnemar_p"] == pytest.approx(0.5)  # b=2, c=0: 2 * 1/4
    assert g["ci95"][0] <= 0.5 <= g["ci95"][1]


def test_group_kfold_never_splits_a_group():
    groups = ["a", "a", "b", "c", "c", "c", "d", "e"]
    folds = group_kfold(groups, 3)
    seen = np.concatenate(folds)
    assert sorted(seen.tolist()) == list(range(len(groups)))
    for f in folds:
        others = set(np.concatenate([g for g in folds if g is not f]).tolist())
        assert not {groups[i] for i in f} & {groups[i] for i in others}


def test_logistic_matches_sklearn():
    sk = pytest.importorskip("sklearn.linear_model")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = (X[:, 0] + 0.5 * rng.normal(size=60) > 0).astype(float)
    w, b = fit_logistic(X, y, l2=1.0)
    ref = sk.LogisticRegression(C=1.0, tol=1e-10, max_iter=1000).fit(X, y)
    assert np.allclose(w, ref.coef_[0], atol=1e-4) and b == pytest.approx(ref.intercept_[0], abs=1e-4)


def test_grouped_cv_auc_separable_vs_random_and_degenerate():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2))
    y = (X[:, 0] > 0).astype(int)
    groups = [f"q{i // 2}" for i in range(40)]
    good = grouped_cv_auc(X, y, groups, n_perm=20)
    assert good["auc"] > 0.9 and good["p_value"] <= 0.1
    noise = grouped_cv_auc(rng.normal(size=(40, 2)), y, groups, n_perm=20)
    assert 0.2 < noise["auc"] < 0.8
    few = grouped_cv_auc(X[:3], np.array([1, 0, 0]), groups[:3])
    assert few["auc"] is None and "at least 2" in few["reason"]


def test_surface_features_and_flip_analysis():
    it = IbisItem(id="x", task="What is the melting point of gallium?", query="gallium festival",
                  results=[{"title": "Gallium Festival 2024", "url": "https://www.galliumfest.com/a",
                            "snippet": "Three days of music in 2024."},
                           {"title": "Gallium - Wikipedia", "url": "https://en.wikipedia.org/wiki/Gallium",
                            "snippet": "Gallium is a chemical element."}], label="should_research")
    f = surface_features(it)
    assert len(f) == len(FEATURE_NAMES) == 18
    named = dict(zip(FEATURE_NAMES, f))
    assert named["n_results"] == 2 and named["n_domains"] == 2 and named["share_wikipedia"] == 0.5
    assert named["share_with_year"] == 0.5 and named["query_words"] == 2
    # query {gallium, festival} vs title 1 {gallium, festival, 2024}: 2/3
    assert named["query_title_overlap_max"] == pytest.approx(2 / 3)
    items = []
    dec = {}
    pattern = [(1, 0), (1, 0), (1, 0), (0, 1), (1, 1), (0, 0)]  # 3 inertia flips, 1 reverse, 2 stable
    for k, (o, a) in enumerate(pattern):
        items.append(IbisItem(id=f"i{k}", task=it.task, query=f"q {k}", results=it.results, label="should_research"))
        dec[(f"i{k}", "observer")] = {"correct": bool(o)}
        dec[(f"i{k}", "agentic")] = {"correct": bool(a)}
    fl = flip_analysis(dec, items, n_boot=100, seed=0, n_perm=5)
    assert fl["n_flips"] == 4 and fl["inertia_direction"] == 3 and fl["share_inertia_direction"] == 0.75
    assert fl["auc_flip_direction"]["auc"] is None  # only 1 reverse flip: reported, not computed
