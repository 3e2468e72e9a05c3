"""IBIS statistics against hand-computed values and the documented resampling scheme (the functions
wrap scipy / scikit-learn, so the references here are worked by hand, never the library again)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnprobe.studies.ibis.items import IbisItem
from attnprobe.studies.ibis.metrics import flip_analysis, paired_gap
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


def test_mcnemar_exact_b1_c9_and_large_n():
    # b=1, c=9: n=10, P(X<=1) = (C(10,0) + C(10,1)) / 2^10 = 11/1024 -> two-sided 22/1024
    assert mcnemar_exact(1, 9) == pytest.approx(22 / 1024, rel=1e-12)
    assert mcnemar_exact(9, 1) == pytest.approx(0.021484375, rel=1e-12)
    # b=2, c=3 (n=5, k=2): P(X<=2) = 16/32 -> 2 * 0.5 = 1, capped at 1
    assert mcnemar_exact(2, 3) == pytest.approx(1.0)
    # beyond 2^1024 (the hand-written sum overflowed here): 600 vs 1000 is far from balanced
    assert 0 < mcnemar_exact(600, 1000) < 1e-20


def test_wilson_hand_values():
    # 3/10: centre (p + z^2/2n) / (1 + z^2/n), half-width z sqrt(p(1-p)/n + z^2/4n^2) / (1 + z^2/n)
    z, k, n = 1.959963984540054, 3, 10
    p = k / n
    den = 1 + z * z / n
    centre, half = (p + z * z / (2 * n)) / den, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    lo, hi = wilson_ci(3, 10)
    assert lo == pytest.approx(centre - half, rel=1e-12) and hi == pytest.approx(centre + half, rel=1e-12)
    assert (round(lo, 4), round(hi, 4)) == (0.1078, 0.6032)  # the textbook interval for 3/10
    lo, hi = wilson_ci(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = wilson_ci(5, 10)  # symmetric around 0.5: 0.2366 .. 0.7634
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    assert wilson_ci(10, 10)[1] == 1.0
    assert all(math.isnan(v) for v in wilson_ci(0, 0))


def test_roc_auc_hand_values():
    assert roc_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.75)
    assert roc_auc([0, 1], [0.5, 0.5]) == pytest.approx(0.5)  # a tie counts one half
    # 3 positives x 2 negatives: each 0.5 beats 0.2 and ties 0.5 (1.5, twice), 0.8 beats both (2) -> 5/6
    assert roc_auc([0, 0, 1, 1, 1], [0.2, 0.5, 0.5, 0.8, 0.5]) == pytest.approx(5 / 6)
    assert roc_auc([1, 1, 0], [3, 2, 1]) == 1.0
    assert math.isnan(roc_auc([1, 1], [0.2, 0.3])) and math.isnan(roc_auc([0, 0, 0], [1, 2, 3]))


def _reference_percentile_ci(stat, arrays, n_boot, seed):
    """The documented scheme: rng = default_rng(seed); one index draw integers(0, n, (n_boot, n)) applied
    to every array; the 2.5% and 97.5% quantiles (linear interpolation) of the replicates."""
    n = len(arrays[0])
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    reps = np.stack([stat(*(a[i] for a in arrays)) for i in idx])
    return np.quantile(reps, [0.025, 0.975], axis=0)


def test_bootstrap_follows_the_documented_draws():
    rng = np.random.default_rng(7)
    xa, xb = rng.integers(0, 2, 23).astype(float), rng.integers(0, 2, 23).astype(float)
    lo, hi = bootstrap_ci(lambda u, v, axis: v.mean(axis) - u.mean(axis), xa, xb, n_boot=2000, seed=3)
    ref = _reference_percentile_ci(lambda u, v: v.mean() - u.mean(), (xa, xb), 2000, 3)
    assert isinstance(lo, float) and (lo, hi) == pytest.approx(tuple(ref), abs=1e-12)
    # a statistic without an axis keyword is called per replicate: same numbers
    assert bootstrap_ci(lambda u, v: v.mean() - u.mean(), xa, xb, n_boot=2000, seed=3) == pytest.approx((lo, hi))
    # per-cell CIs of the mean over items (e.g. [items, layers, heads]), batched: the same draws for every cell
    x = rng.normal(size=(17, 4, 3))
    lo3, hi3 = bootstrap_mean_ci(x, n_boot=1500, seed=5)
    ref3 = _reference_percentile_ci(lambda a: a.mean(axis=0), (x,), 1500, 5)
    assert lo3.shape == hi3.shape == (4, 3)
    np.testing.assert_allclose(lo3, ref3[0], atol=1e-12)
    np.testing.assert_allclose(hi3, ref3[1], atol=1e-12)
    # one item resamples to itself; no items: NaN
    assert bootstrap_mean_ci(np.array([[0.25, 0.5]]), n_boot=100)[0].tolist() == [0.25, 0.5]
    assert bootstrap_ci(lambda u, axis: u.mean(axis), np.array([0.4]), n_boot=100) == (0.4, 0.4)
    assert all(math.isnan(v) for v in bootstrap_ci(lambda u, axis: u.mean(axis), np.array([]), n_boot=100))


def test_bootstrap_ci_constant_and_reproducible():
    x = np.ones(20)
    assert bootstrap_ci(lambda a, axis: a.mean(axis), x, n_boot=200) == (1.0, 1.0)
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 50).astype(float)
    a = bootstrap_ci(lambda v, axis: v.mean(axis), y, n_boot=2000, seed=3)
    b = bootstrap_ci(lambda v, axis: v.mean(axis), y, n_boot=2000, seed=3)
    assert a == b
    lo, hi = a
    se = y.std() / math.sqrt(len(y))  # percentile CI ~ mean +- 1.96 SE
    assert lo == pytest.approx(y.mean() - 1.96 * se, abs=0.03) and hi == pytest.approx(y.mean() + 1.96 * se, abs=0.03)
    lo2, hi2 = bootstrap_mean_ci(y, n_boot=2000, seed=3)
    assert (float(lo2), float(hi2)) == pytest.approx((lo, hi), abs=1e-12)  # the same draws


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
    # largest group first, each to the smallest fold (first on ties), equal groups by name:
    # c(3) -> 0, a(2) -> 1, b(1) -> 2, d(1) -> 2, e(1) -> 1
    assert [f.tolist() for f in folds] == [[3, 4, 5], [0, 1, 7], [2, 6]]
    assert [f.tolist() for f in group_kfold(["q1", "q2", "q3", "q4", "q5"], 3)] == [[0, 3], [1, 4], [2]]
    assert len(group_kfold(["x", "y", "x"], 5)) == 2  # at most one fold per group
    with pytest.raises(ValueError, match="at least 2 groups"):
        group_kfold(["x", "x"], 5)


def test_logistic_is_the_l2_optimum_with_a_free_intercept():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = (X[:, 0] + 0.5 * rng.normal(size=60) > 0).astype(float)
    for l2 in (0.5, 1.0, 4.0):
        w, b = fit_logistic(X, y, l2=l2)
        p = 1 / (1 + np.exp(-(X @ w + b)))
        # gradient of sum(log-loss) + l2/2 |w|^2: zero for w; the intercept is unpenalised
        np.testing.assert_allclose(X.T @ (p - y) + l2 * w, 0, atol=1e-6)
        assert abs((p - y).sum()) < 1e-6
    assert np.abs(fit_logistic(X, y, l2=50.0)[0]).sum() < np.abs(fit_logistic(X, y, l2=0.5)[0]).sum()


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
