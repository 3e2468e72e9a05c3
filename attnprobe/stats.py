"""The statistics every study uses, on scipy and scikit-learn (no study's own measures here).

- :func:`mcnemar_exact`: two-sided exact McNemar test = binomial test of the discordant pairs against
  p = 1/2 (``scipy.stats.binomtest``).
- :func:`bootstrap_ci` / :func:`bootstrap_mean_ci`: percentile bootstrap over items
  (``scipy.stats.bootstrap``, paired: one index draw per replicate is applied to every array), fixed seed.
- :func:`wilson_ci`: Wilson score interval for a proportion.
- :func:`roc_auc`: ``sklearn.metrics.roc_auc_score`` (ties count one half); NaN without both classes.
- :func:`stratified_group_folds` / :func:`grouped_cv_auc`: out-of-fold scores of an L2 logistic
  regression (standardised features) with ``StratifiedGroupKFold`` folds that never split a group (a
  query); the mean of the per-fold AUCs (primary), the pooled AUC (secondary) and a permutation p-value
  that moves whole groups (:func:`group_permuter`).
- :func:`power_note`: the smallest AUC detectable at this n (Hanley-McNeil variance).
- :func:`feature_correlations`: Spearman correlation per feature with BH (``false_discovery_control``)
  and Holm adjustment.
- :func:`rounded`: a statistic made JSON-ready for metrics.json.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
from collections.abc import Callable, Sequence

import numpy as np


class _Lazy:
    """A module imported on first attribute access: scipy and scikit-learn take over a second to import,
    and every command's ``--help`` reaches this module through the option records it builds."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)


sklearn = _Lazy("sklearn")
stats = _Lazy("scipy.stats")
optimize = _Lazy("scipy.optimize")
_linear_model = _Lazy("sklearn.linear_model")
_metrics = _Lazy("sklearn.metrics")
_model_selection = _Lazy("sklearn.model_selection")


@functools.cache
def _rng_kw(function: str) -> str:
    """scipy >= 1.15 takes ``rng``; older releases take the same Generator as ``random_state``."""
    return "rng" if "rng" in inspect.signature(getattr(stats, function)).parameters else "random_state"

# Bootstrap resamples of the studies' confidence intervals (their --bootstrap; IBIS's report takes 10000)
STUDY_RESAMPLES = 2000
_BATCH_ELEMENTS = 1 << 24  # resampled values held at once by bootstrap_mean_ci (128 MiB of float64)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for b and c discordant pairs (1.0 when b + c == 0)."""
    n = int(b) + int(c)
    return 1.0 if n == 0 else float(stats.binomtest(min(int(b), int(c)), n, 0.5).pvalue)


def wilson_ci(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    if n == 0:
        return (float("nan"), float("nan"))
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return (float(ci.low), float(ci.high))


def _bootstrap(arrays: Sequence[np.ndarray], stat: Callable, n_boot: int, seed: int, alpha: float,
               batch: int | None = None):
    """scipy's paired percentile bootstrap; it draws ``rng.integers(0, n, (batch, n))`` per batch from
    ``default_rng(seed)``, the same index stream for any batch size. A single item (scipy needs two)
    resamples to itself, so the interval is the statistic."""
    vectorized = "axis" in inspect.signature(stat).parameters
    if len(arrays[0]) == 1:
        v = np.asarray(stat(*arrays, axis=0) if vectorized else stat(*arrays), dtype=np.float64)
        return v, v
    res = stats.bootstrap(arrays, stat, n_resamples=n_boot, batch=batch, vectorized=vectorized, paired=True, axis=0,
                          confidence_level=1 - alpha, method="percentile",
                          **{_rng_kw("bootstrap"): np.random.default_rng(seed)})
    return res.confidence_interval.low, res.confidence_interval.high


def bootstrap_ci(stat: Callable[..., float | np.ndarray], *arrays: np.ndarray, n_boot: int = 10000, seed: int = 0,
                 alpha: float = 0.05) -> tuple[np.ndarray | float, np.ndarray | float]:
    """Percentile CI of ``stat(*arrays)`` resampling the first axis (items) jointly across arrays.
    A ``stat`` with an ``axis`` keyword (``lambda u, v, axis: v.mean(axis) - u.mean(axis)``) is called
    once per batch of replicates; without one, once per replicate."""
    arrays = tuple(np.asarray(a) for a in arrays)
    if len(arrays[0]) == 0:
        return float("nan"), float("nan")
    lo, hi = _bootstrap(arrays, stat, n_boot, seed, alpha)
    return (float(lo), float(hi)) if np.ndim(lo) == 0 else (lo, hi)


def bootstrap_mean_ci(x: np.ndarray, n_boot: int = 10000, seed: int = 0, alpha: float = 0.05):
    """Percentile CI of the mean over the first axis (any trailing shape, e.g. [items, layers, heads])."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    if n == 0:
        nan = np.full(x.shape[1:], np.nan)
        return nan, nan
    batch = max(1, min(n_boot, _BATCH_ELEMENTS // max(1, x.size)))
    lo, hi = _bootstrap((x,), lambda a, axis: a.mean(axis=axis), n_boot, seed, alpha, batch)
    return np.reshape(lo, x.shape[1:]), np.reshape(hi, x.shape[1:])


def roc_auc(y: Sequence[int], score: Sequence[float]) -> float:
    """AUC = P(score_pos > score_neg) + 0.5 P(tie); NaN without both classes."""
    y = np.asarray(y, dtype=int)
    if len(np.unique(y)) < 2:
        return float("nan")
    return float(_metrics.roc_auc_score(y, np.asarray(score, dtype=np.float64)))


def rounded(x, nd: int = 4):
    """A statistic made JSON-ready: numpy scalars to Python numbers, rounded; NaN to None."""
    if x is None:
        return None
    if isinstance(x, np.ndarray) and x.size == 1:
        x = float(x.reshape(-1)[0])
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return None if math.isnan(float(x)) else round(float(x), nd)
    return x


def _group_codes(groups: Sequence) -> np.ndarray:
    """Integer code per row (groups compared as strings)."""
    return np.unique(np.asarray([str(g) for g in groups]), return_inverse=True)[1].reshape(-1)


def stratified_group_folds(y: Sequence[int], groups: Sequence, n_splits: int = 5,
                           seed: int = 0) -> tuple[list[np.ndarray], str | None]:
    """Test-index arrays of ``StratifiedGroupKFold(shuffle=True, random_state=seed)``: a group never
    straddles folds and each fold's class mix stays close to the whole set's.

    A fold can hold a class only if the class reaches it through some group, so ``n_splits`` is reduced
    to the number of groups holding the rarer class when that is smaller; the second value then says so
    (None otherwise). Fewer than 2 such groups: ValueError."""
    y = np.asarray(y, dtype=int)
    codes = _group_codes(groups)
    per_class = [len(np.unique(codes[y == c])) for c in (0, 1)]
    k = min(n_splits, *per_class)
    if k < 2:
        raise ValueError(f"needs each class in at least 2 query groups (got {per_class[1]} with a positive, "
                         f"{per_class[0]} with a negative)")
    note = None if k == n_splits else (f"n_splits reduced from {n_splits} to {k}: the rarer class occurs in only "
                                       f"{k} query groups")
    cv = _model_selection.StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed)
    folds = [test for _, test in cv.split(np.zeros((len(y), 1)), y, codes) if len(test)]
    return folds, note


def fit_logistic(X: np.ndarray, y: np.ndarray, l2: float = 1.0, iters: int = 100) -> tuple[np.ndarray, float]:
    """L2-penalised logistic regression (penalty l2/2 * |w|^2, intercept unpenalised)."""
    model = _linear_model.LogisticRegression(C=1.0 / l2, solver="newton-cholesky", tol=1e-10, max_iter=iters)
    model.fit(X, y)
    return model.coef_[0], float(model.intercept_[0])


def oof_scores(X: np.ndarray, y: np.ndarray, folds: Sequence[np.ndarray], l2: float = 1.0) -> np.ndarray:
    """Out-of-fold decision values: each test fold scored by a model fit on the other folds, with the
    features standardised by the training rows' mean and SD."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    out = np.empty(len(y))
    for test in folds:
        train = np.ones(len(y), dtype=bool)
        train[test] = False
        if len(np.unique(y[train])) < 2:
            out[test] = y[train].mean()  # nothing to learn: a constant score
            continue
        mu, sd = X[train].mean(0), X[train].std(0)
        sd[sd == 0] = 1.0
        w, b = fit_logistic((X[train] - mu) / sd, y[train], l2=l2)
        out[test] = (X[test] - mu) / sd @ w + b
    return out


def _cv_aucs(X, y, folds, l2: float) -> tuple[float, list[float], float]:
    """(mean of the per-fold AUCs over folds holding both classes, per-fold AUCs, AUC of pooled scores)."""
    s = oof_scores(X, y, folds, l2)
    per_fold = [roc_auc(y[t], s[t]) for t in folds]
    ok = [a for a in per_fold if not math.isnan(a)]
    return (float(np.mean(ok)) if ok else float("nan")), per_fold, roc_auc(y, s)


_PERM_GROUP_FEATURES = ("features are constant within each query group, so each permutation hands every group the "
                        "feature vector of another group (a random permutation of the groups); labels, group sizes "
                        "and folds stay as observed")
_PERM_EQUAL_SIZE = ("features vary within a query group, so each permutation exchanges whole label vectors among "
                    "groups of equal size (row i of one group takes row i's label of the other, in input order); "
                    "a group whose size is unique keeps its labels (conservative); folds are redrawn per permutation")


def group_permuter(X: np.ndarray, y: np.ndarray, groups: Sequence) -> tuple[str, Callable]:
    """The permutation scheme for the null "features carry no information about the labels", moving
    whole query groups so that rows of one group (e.g. one item under several models) stay together.

    Returns (description, draw) where ``draw(rng)`` gives a permuted (X, y). When every group has one
    feature vector (item-level features; always so with one row per group) the feature vectors are
    permuted across groups, which allows groups of unequal size; otherwise label vectors are exchanged
    only among groups of the same size."""
    X, y, codes = np.asarray(X, dtype=np.float64), np.asarray(y), _group_codes(groups)
    n_groups = int(codes.max()) + 1
    rep = X[np.unique(codes, return_index=True)[1]]  # the first row of each group (codes are 0 .. n_groups-1)
    if np.array_equal(X, rep[codes]):
        return _PERM_GROUP_FEATURES, lambda rng: (rep[rng.permutation(n_groups)][codes], y)
    members = [np.flatnonzero(codes == g) for g in range(n_groups)]
    sizes = np.asarray([len(m) for m in members])
    strata = [np.flatnonzero(sizes == s) for s in np.unique(sizes)]

    def draw(rng):
        yp = y.copy()
        for st in strata:
            for g, src in zip(st, rng.permutation(st)):
                yp[members[g]] = y[members[src]]
        return X, yp

    return _PERM_EQUAL_SIZE, draw


def grouped_cv_auc(X, y, groups, *, n_splits: int = 5, n_perm: int = 200, seed: int = 0,
                   min_per_class: int = 2, l2: float = 1.0) -> dict:
    """Cross-validated AUC of an L2 logistic regression on ``X`` predicting binary ``y``, with folds that
    never split a query group, and a permutation p-value that moves whole groups.

    ``auc`` (= ``auc_mean_over_folds``, the primary number) is the mean of the per-fold ROC AUCs over the
    test folds holding both classes (seed 002 D.5 "macroaverages held-out-fold ... ROC-AUC values"); its
    null expectation is exactly 1/2, since each fold's scores come from a model that never saw its rows.
    ``auc_pooled`` ranks all out-of-fold scores together (secondary): scores of different fold models are
    offset by their training class balance, which anticorrelates with the test labels, so it is biased
    below 1/2 at small n. ``p_value``: one-sided, (1 + #{null >= observed}) / (1 + valid permutations) of
    the fold-mean AUC under :func:`group_permuter`."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=int)
    n_pos, n_neg = int(y.sum()), int((1 - y).sum())
    codes = _group_codes(groups) if len(y) else np.zeros(0, dtype=int)
    base = {"n": int(len(y)), "n_positive": n_pos, "n_negative": n_neg, "n_groups": int(len(np.unique(codes)))}
    if n_pos < min_per_class or n_neg < min_per_class:
        return {**base, "auc": None, "p_value": None,
                "reason": f"needs at least {min_per_class} examples of each class (got {n_pos} positive, "
                          f"{n_neg} negative)"}
    if base["n_groups"] < 2:
        return {**base, "auc": None, "p_value": None, "reason": "needs at least 2 query groups"}
    try:
        folds, note = stratified_group_folds(y, codes, n_splits, seed)
    except ValueError as e:
        return {**base, "auc": None, "p_value": None, "reason": str(e)}
    with sklearn.config_context(assume_finite=True, skip_parameter_validation=True):  # ~1000 small fits
        mean, per_fold, pooled = _cv_aucs(X, y, folds, l2)
        if math.isnan(mean):
            return {**base, "auc": None, "p_value": None, "reason": "no test fold holds both classes"}
        scheme, draw = group_permuter(X, y, codes)
        rng = np.random.default_rng(seed)
        null = []
        for _ in range(n_perm):
            Xp, yp = draw(rng)
            fp = folds if yp is y else stratified_group_folds(yp, codes, n_splits, seed)[0]
            null.append(_cv_aucs(Xp, yp, fp, l2)[0])
    null = np.asarray([a for a in null if not math.isnan(a)])
    # fold-mean AUCs are sums of multiples of 1 / (2 n_pos n_neg): equal values can differ by an ulp
    p = (1 + int((null >= mean - 1e-12).sum())) / (1 + len(null))
    out = {**base, "auc": mean, "auc_mean_over_folds": mean,
           "auc_per_fold": [None if math.isnan(a) else a for a in per_fold],
           "n_folds": len(folds), "n_folds_skipped": sum(math.isnan(a) for a in per_fold),
           "auc_pooled": pooled,
           "auc_pooled_note": "secondary: one AUC over the pooled out-of-fold scores of all folds (biased below 0.5 "
                              "under the null at small n)",
           "p_value": float(p), "n_permutations": n_perm, "n_permutations_valid": int(len(null)),
           "permutation": scheme, "n_splits": len(folds), "n_splits_requested": n_splits}
    if note:
        out["folds_note"] = note
    return out


def hanley_mcneil_se(auc: float, n_pos: int, n_neg: int) -> float:
    """Standard error of an AUC (Hanley & McNeil 1982, Radiology 143:29, eq. 2):
    Var = [A(1-A) + (n_pos-1)(Q1-A^2) + (n_neg-1)(Q2-A^2)] / (n_pos n_neg), Q1 = A/(2-A), Q2 = 2A^2/(1+A).
    At A = 1/2 it is the exact Mann-Whitney null variance (n_pos + n_neg + 1) / (12 n_pos n_neg)."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    var = (auc * (1 - auc) + (n_pos - 1) * (q1 - auc * auc) + (n_neg - 1) * (q2 - auc * auc)) / (n_pos * n_neg)
    return math.sqrt(max(var, 0.0))


def power_note(n_pos: int, n_neg: int, alpha: float = 0.05, power: float = 0.8, *,
               positives: str = "positives", negatives: str = "negatives") -> dict:
    """The smallest AUC that a one-sided test at level ``alpha`` (the permutation test's direction)
    detects with probability ``power`` at this sample size: the A solving
    A - 1/2 = z(1-alpha) SE(1/2) + z(power) SE(A), SE from :func:`hanley_mcneil_se`. That SE is a fixed
    score's; a cross-validated AUC varies more, so the true minimum is higher (a lower bound)."""
    method = ("Hanley-McNeil variance of the AUC, one-sided normal test; lower bound for a cross-validated AUC")
    out = {"n_positive": int(n_pos), "n_negative": int(n_neg), "alpha": alpha, "power": power, "method": method,
           "min_detectable_auc": None}
    if n_pos < 1 or n_neg < 1:
        return {**out, "sentence": f"no power note: needs both {positives} and {negatives} (got {n_pos}, {n_neg})"}
    za, zb = stats.norm.ppf(1 - alpha), stats.norm.ppf(power)
    se0 = hanley_mcneil_se(0.5, n_pos, n_neg)

    def excess(a):
        return a - 0.5 - za * se0 - zb * hanley_mcneil_se(a, n_pos, n_neg)

    if excess(1.0) <= 0:
        return {**out, "sentence": f"with {n_pos} {positives} and {n_neg} {negatives}, not even an AUC of 1 would be "
                                   f"detected with {power:.0%} power (one-sided alpha {alpha})"}
    a = float(optimize.brentq(excess, 0.5, 1.0, xtol=1e-10))
    shown = f"above {a:.2f}" if round(a, 2) < 1 else f"above {a:.3f}" if round(a, 3) < 1 else "of 1 (perfect)"
    return {**out, "min_detectable_auc": a,
            "sentence": f"with {n_pos} {positives} and {n_neg} {negatives}, only an AUC {shown} would be "
                        f"detected with {power:.0%} power (one-sided alpha {alpha}; Hanley-McNeil variance, a lower "
                        f"bound for a cross-validated AUC)"}


def holm(p: Sequence[float]) -> np.ndarray:
    """Holm step-down adjusted p-values: sorted p_(i) times (m - i + 1), running maximum, capped at 1."""
    p = np.asarray(p, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    adj = np.minimum(1.0, np.maximum.accumulate((len(p) - np.arange(len(p))) * p[order]))
    out = np.empty_like(p)
    out[order] = adj
    return out


def spearman_permutation(x, y, *, n_resamples: int = 9999, seed: int = 0) -> tuple[float, float]:
    """Spearman's rho and its two-sided permutation p-value (``scipy.stats.permutation_test`` permuting
    the pairing; exact when n! <= n_resamples). Exact under ties, which the t approximation of
    ``spearmanr`` is not (a gap in {-1, 0, 1} is mostly ties), and never 0 at small n."""
    rx = stats.rankdata(x)

    def rho(ry, axis=-1):
        a = rx - rx.mean()
        b = ry - ry.mean(axis=axis, keepdims=True)
        return (a * b).sum(axis=axis) / np.sqrt((a * a).sum() * (b * b).sum(axis=axis))

    res = stats.permutation_test((stats.rankdata(y),), rho, permutation_type="pairings", vectorized=True,
                                 n_resamples=n_resamples, alternative="two-sided",
                                 **{_rng_kw("permutation_test"): np.random.default_rng(seed)})
    return float(res.statistic), float(res.pvalue)


def feature_correlations(X, gap, names: Sequence[str] = (), *, alpha: float = 0.05, n_resamples: int = 9999,
                         seed: int = 0) -> dict:
    """Spearman correlation of each feature column with the per-item gap, its permutation p-value
    (:func:`spearman_permutation`), and p-values adjusted over the features tested: Benjamini-Hochberg
    (``scipy.stats.false_discovery_control``, the primary correction) and Holm. A feature constant
    over the items has no correlation (None) and is not counted among the tests."""
    X = np.asarray(X, dtype=np.float64)
    gap = np.asarray(gap, dtype=np.float64)
    names = list(names) or [f"x{j}" for j in range(X.shape[1])]
    base = {"n_items": int(len(gap)), "alpha": alpha, "correction": "Benjamini-Hochberg (primary), Holm",
            "p_values": f"two-sided permutation test of Spearman's rho ({n_resamples} permutations or exact)"}
    if len(gap) < 3 or np.ptp(gap) == 0:
        return {**base, "features": [], "n_tested": 0, "n_significant_after_correction": 0,
                "n_significant_holm": 0, "reason": "needs at least 3 items and a gap that varies"}
    rho, p = np.full(len(names), np.nan), np.full(len(names), np.nan)
    for j in range(len(names)):
        if np.ptp(X[:, j]) > 0:
            rho[j], p[j] = spearman_permutation(X[:, j], gap, n_resamples=n_resamples, seed=seed + j)
    tested = ~np.isnan(p)
    bh, hm = np.full(len(names), np.nan), np.full(len(names), np.nan)
    if tested.any():
        bh[tested] = stats.false_discovery_control(p[tested], method="bh")
        hm[tested] = holm(p[tested])
    rows = [{"feature": nm, "spearman_rho": rounded(rho[j]), "p_value": rounded(p[j], 6), "p_bh": rounded(bh[j], 6),
             "p_holm": rounded(hm[j], 6)} for j, nm in enumerate(names)]
    return {**base, "features": rows, "n_tested": int(tested.sum()),
            "n_significant_after_correction": int((bh[tested] <= alpha).sum()),
            "n_significant_holm": int((hm[tested] <= alpha).sum()),
            "n_significant_uncorrected": int((p[tested] <= alpha).sum())}
