"""IBIS statistics against hand-computed values and the documented resampling scheme (the functions
wrap scipy / scikit-learn, so the references here are worked by hand, never the library again)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnprobe.stats import (
    bootstrap_ci,
    bootstrap_mean_ci,
    feature_correlations,
    fit_logistic,
    group_permuter,
    grouped_cv_auc,
    hanley_mcneil_se,
    holm,
    mcnemar_exact,
    oof_scores,
    power_note,
    roc_auc,
    rounded,
    stratified_group_folds,
    wilson_ci,
)
from attnprobe.studies.ibis.features import FEATURE_NAMES, surface_features
from attnprobe.studies.ibis.items import IbisItem
from attnprobe.studies.ibis.metrics import paired_gap


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


def _assert_groups_whole(folds, groups):
    seen = np.concatenate(folds)
    assert sorted(seen.tolist()) == list(range(len(groups)))  # every row in exactly one test fold
    where = {}
    for k, f in enumerate(folds):
        for i in f:
            assert where.setdefault(groups[i], k) == k, f"group {groups[i]} split across folds"


def test_stratified_group_folds_keep_groups_whole_and_stratify():
    # 20 groups of 2 rows sharing a label: 8 positive groups, 12 negative, 4 folds -> 2 positive groups
    # (4 rows) and 3 negative groups (6 rows) per fold
    y = np.repeat([1] * 8 + [0] * 12, 2)
    groups = [f"q{i}" for i in np.repeat(np.arange(20), 2)]
    for seed in range(3):
        folds, note = stratified_group_folds(y, groups, 4, seed)
        assert note is None and len(folds) == 4
        _assert_groups_whole(folds, groups)
        assert [int(y[f].sum()) for f in folds] == [4, 4, 4, 4] and [len(f) for f in folds] == [10] * 4
    # groups of unequal size with mixed labels: still never split
    rng = np.random.default_rng(0)
    groups = [f"g{k}" for k in rng.integers(0, 12, 60)]
    y = rng.integers(0, 2, 60)
    _assert_groups_whole(stratified_group_folds(y, groups, 5, 1)[0], groups)
    # 12 positives among 30 singletons in 5 folds: 2 or 3 positives in each
    y = np.array([1] * 12 + [0] * 18)
    folds, _ = stratified_group_folds(y, list(range(30)), 5, 0)
    assert sorted(int(y[f].sum()) for f in folds) == [2, 2, 2, 3, 3] and {len(f) for f in folds} == {6}
    # the seed reshuffles the groups; the same seed gives the same folds
    f0 = [f.tolist() for f in stratified_group_folds(y, list(range(30)), 5, 0)[0]]
    assert f0 == [f.tolist() for f in stratified_group_folds(y, list(range(30)), 5, 0)[0]]
    assert f0 != [f.tolist() for f in stratified_group_folds(y, list(range(30)), 5, 1)[0]]


def test_stratified_group_folds_reduce_n_splits_when_a_class_is_in_few_groups():
    y = np.array([1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0])
    groups = ["a", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]  # positives in 3 groups only
    folds, note = stratified_group_folds(y, groups, 5, 0)
    assert len(folds) == 3 and note == "n_splits reduced from 5 to 3: the rarer class occurs in only 3 query groups"
    assert all(0 < y[f].sum() < len(f) for f in folds)  # each fold holds both classes
    with pytest.raises(ValueError, match="at least 2 query groups .got 1 with a positive"):
        stratified_group_folds([1, 1, 0, 0], ["a", "a", "b", "c"], 5, 0)


def test_group_permuter_moves_whole_groups():
    rng = np.random.default_rng(3)
    # item-level features (one vector per group, groups of sizes 1..3): feature vectors move between groups
    groups = ["a", "b", "b", "c", "c", "c", "d"]
    rep = {g: rng.normal(size=2) for g in "abcd"}
    X = np.stack([rep[g] for g in groups])
    y = np.array([1, 0, 1, 1, 1, 0, 0])
    scheme, draw = group_permuter(X, y, groups)
    assert scheme.startswith("features are constant within each query group")
    seen = set()
    for _ in range(40):
        Xp, yp = draw(rng)
        assert yp is y
        got = {}
        for g, row in zip(groups, Xp):
            assert np.array_equal(got.setdefault(g, row), row)  # one vector per group
        assert sorted(map(tuple, got.values())) == sorted(map(tuple, rep.values()))  # a permutation of them
        seen.add(tuple(tuple(got[g]) for g in "abcd"))
    assert len(seen) > 5  # it does move them
    # row-level features: label vectors are exchanged only among groups of equal size, whole
    X = rng.normal(size=(7, 2))
    groups = ["a", "a", "b", "b", "c", "d", "e"]
    y = np.array([1, 0, 0, 0, 1, 0, 0])
    scheme, draw = group_permuter(X, y, groups)
    assert scheme.startswith("features vary within a query group")
    pairs, singles = set(), set()
    for _ in range(40):
        Xp, yp = draw(rng)
        assert Xp is X
        pairs.add((tuple(yp[0:2]), tuple(yp[2:4])))
        singles.add(tuple(yp[4:]))
    assert pairs == {((1, 0), (0, 0)), ((0, 0), (1, 0))}  # a's vector [1, 0] moves whole, never split to [1, 1]
    assert singles == {(1, 0, 0), (0, 1, 0), (0, 0, 1)}


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
    good = grouped_cv_auc(X, y, groups, n_perm=19)
    assert good["auc"] == good["auc_mean_over_folds"] > 0.95 and good["auc_pooled"] > 0.95
    assert good["p_value"] == pytest.approx(1 / 20)  # no permutation reaches it
    assert good["n_splits"] == good["n_folds"] == 5 and good["n_folds_skipped"] == 0
    assert good["auc_mean_over_folds"] == pytest.approx(np.mean(good["auc_per_fold"]))
    assert good["n_permutations_valid"] == 19 and "folds_note" not in good
    assert good["permutation"].startswith("features vary within a query group")  # pairs of rows differ in X
    noise = grouped_cv_auc(rng.normal(size=(40, 2)), y, groups, n_perm=19)
    assert 0.2 < noise["auc"] < 0.8 and noise["p_value"] > 0.05
    few = grouped_cv_auc(X[:3], np.array([1, 0, 0]), groups[:3])
    assert few["auc"] is None and "at least 2" in few["reason"]
    # 2 positives in one query group: no stratified fold split can place a positive in two folds
    one = grouped_cv_auc(X[:6], np.array([1, 1, 0, 0, 0, 0]), ["a", "a", "b", "c", "d", "e"])
    assert one["auc"] is None and one["reason"].startswith("needs each class in at least 2 query groups")


def test_fold_mean_auc_is_unbiased_where_the_pooled_auc_is_not():
    """Under the null (features independent of labels) each fold's scores come from a model that never saw
    that fold, so each fold's AUC has expectation 1/2; pooling ranks scores of different fold models
    together, whose intercepts follow their training class balance, which anticorrelates with the test
    fold's labels: below 1/2. Folds of unequal class mix (plain contiguous folds) show it at n = 30."""
    rng = np.random.default_rng(11)
    folds = np.array_split(np.arange(30), 5)
    pooled, mean = [], []
    for _ in range(100):
        X = rng.normal(size=(30, 1))
        y = rng.permutation(np.r_[np.ones(12, int), np.zeros(18, int)])
        s = oof_scores(X, y, folds)
        pooled.append(roc_auc(y, s))
        per = [roc_auc(y[f], s[f]) for f in folds]
        mean.append(np.nanmean(per))
    # SE of either mean over 100 draws is about 0.015
    assert np.mean(pooled) < 0.44
    assert abs(np.mean(mean) - 0.5) < 0.05


def test_power_note_against_the_hanley_mcneil_formula():
    # null SE: (n+m+1) / (12 n m) = 31 / 2592 for 12 vs 18
    assert hanley_mcneil_se(0.5, 12, 18) == pytest.approx(math.sqrt(31 / 2592), rel=1e-12)
    # A = 0.8: Q1 = 0.8 / 1.2, Q2 = 1.28 / 1.8, Var = [0.16 + 11 (Q1 - 0.64) + 17 (Q2 - 0.64)] / 216
    q1, q2 = 0.8 / 1.2, 1.28 / 1.8
    assert hanley_mcneil_se(0.8, 12, 18) == pytest.approx(math.sqrt((0.16 + 11 * (q1 - .64) + 17 * (q2 - .64)) / 216))
    note = power_note(12, 18, positives="flips", negatives="items without a flip")
    a = note["min_detectable_auc"]
    # the definition: A - 1/2 = z(0.95) SE(1/2) + z(0.8) SE(A)
    za, zb = 1.6448536269514722, 0.8416212335729143
    assert a - 0.5 == pytest.approx(za * math.sqrt(31 / 2592) + zb * hanley_mcneil_se(a, 12, 18), abs=1e-8)
    assert round(a, 3) == 0.759
    assert note["sentence"].startswith("with 12 flips and 18 items without a flip, only an AUC above 0.76 would be "
                                       "detected with 80% power")
    # more items, smaller detectable effects; 1 vs 2 cannot reach one-sided 5% at all
    assert power_note(100, 100)["min_detectable_auc"] < power_note(10, 10)["min_detectable_auc"] < a + 0.1
    assert power_note(1, 2)["min_detectable_auc"] is None and "not even an AUC of 1" in power_note(1, 2)["sentence"]
    assert power_note(0, 5)["min_detectable_auc"] is None
    assert "only an AUC above 0.998 would" in power_note(2, 3)["sentence"]  # never rounded up to 1.00
    assert power_note(1, 29)["min_detectable_auc"] > 0.9995 and "only an AUC of 1 (perfect) would" in \
        power_note(1, 29)["sentence"]


def test_holm_and_bh_by_hand():
    p = np.array([0.01, 0.04, 0.03, 0.005])
    # Holm: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> running max
    np.testing.assert_allclose(holm(p), [0.03, 0.06, 0.06, 0.02])
    # BH: sorted p * 4 / rank = 0.02, 0.02, 0.04, 0.04 -> running min from the top, back in input order
    from scipy.stats import false_discovery_control
    np.testing.assert_allclose(false_discovery_control(p, method="bh"), [0.02, 0.04, 0.04, 0.02])


def _exact_spearman_p(x, y):
    """Reference: Spearman rho = Pearson of ranks (average ranks for ties); p = share of all n! pairings
    with |rho| at least the observed one."""
    from itertools import permutations

    from scipy.stats import rankdata
    rx, ry = rankdata(x), rankdata(y)

    def r(a, b):
        a, b = a - a.mean(), b - b.mean()
        return (a * b).sum() / math.sqrt((a * a).sum() * (b * b).sum())

    obs = r(rx, ry)
    perms = [r(rx, ry[list(q)]) for q in permutations(range(len(y)))]
    return obs, sum(abs(v) >= abs(obs) - 1e-12 for v in perms) / len(perms)


def test_feature_correlations_exact_p_and_bh():
    gap = np.array([1, 0, 0, -1, 1, 0], dtype=float)  # ties, as for a correct(observer) - correct(agentic) gap
    X = np.array([[6, 1, 5, 2],
                  [4, 2, 5, 5],
                  [3, 3, 5, 1],
                  [1, 4, 5, 6],
                  [5, 5, 5, 3],
                  [2, 6, 5, 4]], dtype=float)
    fc = feature_correlations(X, gap, ["a", "b", "c", "d"])
    ref = [_exact_spearman_p(X[:, j], gap) for j in (0, 1, 3)]  # c is constant: not tested
    got = {r["feature"]: r for r in fc["features"]}
    for (rho, p), name in zip(ref, "abd"):
        assert got[name]["spearman_rho"] == pytest.approx(rho, abs=1e-4)
        assert got[name]["p_value"] == pytest.approx(p, abs=1e-6)  # 6! = 720 <= 9999: exact enumeration
    assert got["c"]["spearman_rho"] is None and got["c"]["p_bh"] is None and fc["n_tested"] == 3
    # BH by hand over the three tested p-values
    ps = np.array([p for _, p in ref])
    order = np.argsort(ps)
    bh = np.empty(3)
    running = 1.0
    for rank in (3, 2, 1):
        i = order[rank - 1]
        running = min(running, ps[i] * 3 / rank)
        bh[i] = running
    for name, v in zip("abd", bh):
        assert got[name]["p_bh"] == pytest.approx(v, abs=1e-6)
    assert fc["n_significant_after_correction"] == int((bh <= 0.05).sum())
    # a feature that is the gap itself, with enough items, survives the correction; a constant gap is refused
    rng = np.random.default_rng(0)
    g = rng.normal(size=30)
    fc = feature_correlations(np.c_[g, rng.normal(size=(30, 3))], g, n_resamples=999)
    # no permutation of 999 reaches |rho| = 1: two-sided p = 2 / 1000, BH over 4 tests at rank 1: x 4
    assert fc["features"][0]["spearman_rho"] == 1.0 and fc["features"][0]["p_value"] == pytest.approx(0.002)
    assert fc["features"][0]["p_bh"] == pytest.approx(0.008) and fc["features"][0]["p_holm"] == pytest.approx(0.008)
    assert fc["n_significant_after_correction"] >= 1
    assert feature_correlations(X, np.zeros(6))["reason"] == "needs at least 3 items and a gap that varies"


def test_rounded_is_json_ready():
    assert rounded(np.float64(0.123456)) == 0.1235 and rounded(float("nan")) is None and rounded(None) is None
    assert type(rounded(np.int64(3))) is int and rounded(np.array([0.5])) == 0.5


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
