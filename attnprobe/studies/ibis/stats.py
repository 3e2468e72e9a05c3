"""Statistics for IBIS, on scipy and scikit-learn.

- :func:`mcnemar_exact`: two-sided exact McNemar test = binomial test of the discordant pairs against
  p = 1/2 (``scipy.stats.binomtest``).
- :func:`bootstrap_ci` / :func:`bootstrap_mean_ci`: percentile bootstrap over items
  (``scipy.stats.bootstrap``, paired: one index draw per replicate is applied to every array), fixed seed.
- :func:`wilson_ci`: Wilson score interval for a proportion.
- :func:`roc_auc`: ``sklearn.metrics.roc_auc_score`` (ties count one half); NaN without both classes.
- :func:`group_kfold` / :func:`grouped_cv_auc`: out-of-fold scores of an L2 logistic regression
  (standardised features) with ``GroupKFold`` folds that never split a group (a query), pooled into
  one AUC; a label-permutation p-value.
- :func:`surface_features`: 18 shallow features of an item's results (paper appendix A.5).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Sequence
from urllib.parse import urlparse

import numpy as np
import sklearn
from scipy import stats
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import GroupKFold

# scipy >= 1.15 takes ``rng``; older releases take the same Generator as ``random_state``
_RNG_KW = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"
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
                          **{_RNG_KW: np.random.default_rng(seed)})
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
    return float(roc_auc_score(y, np.asarray(score, dtype=np.float64)))


def group_kfold(groups: Sequence, n_splits: int) -> list[np.ndarray]:
    """Test-index arrays of ``n_splits`` folds (fewer when there are fewer groups); a group never
    straddles folds (largest groups first, each to the currently smallest fold; deterministic)."""
    uniq, inverse = np.unique(np.asarray([str(g) for g in groups]), return_inverse=True)
    n_splits = min(n_splits, len(uniq))
    if n_splits < 2:
        raise ValueError("grouped cross-validation needs at least 2 groups")
    # GroupKFold takes equally large groups in descending label order: label by reversed name rank so
    # ties go alphabetically (the fold assignment of earlier releases).
    codes = len(uniq) - 1 - inverse.reshape(-1)
    return [test for _, test in GroupKFold(n_splits).split(codes, groups=codes)]


def fit_logistic(X: np.ndarray, y: np.ndarray, l2: float = 1.0, iters: int = 100) -> tuple[np.ndarray, float]:
    """L2-penalised logistic regression (penalty l2/2 * |w|^2, intercept unpenalised)."""
    model = LogisticRegression(C=1.0 / l2, solver="newton-cholesky", tol=1e-10, max_iter=iters)
    model.fit(X, y)
    return model.coef_[0], float(model.intercept_[0])


def oof_scores(X: np.ndarray, y: np.ndarray, groups: Sequence, n_splits: int = 5, l2: float = 1.0) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    out = np.empty(len(y))
    for test in group_kfold(groups, n_splits):
        train = np.setdiff1d(np.arange(len(y)), test)
        if len(np.unique(y[train])) < 2:
            out[test] = y[train].mean()  # nothing to learn: a constant score
            continue
        mu, sd = X[train].mean(0), X[train].std(0)
        sd[sd == 0] = 1.0
        w, b = fit_logistic((X[train] - mu) / sd, y[train], l2=l2)
        out[test] = (X[test] - mu) / sd @ w + b
    return out


def grouped_cv_auc(X, y, groups, *, n_splits: int = 5, n_perm: int = 200, seed: int = 0,
                   min_per_class: int = 2) -> dict:
    """Out-of-fold AUC of surface features predicting ``y``, with a permutation p-value."""
    y = np.asarray(y, dtype=int)
    n_pos, n_neg = int(y.sum()), int((1 - y).sum())
    base = {"n": int(len(y)), "n_positive": n_pos, "n_negative": n_neg, "n_groups": int(len(set(map(str, groups))))}
    if n_pos < min_per_class or n_neg < min_per_class:
        return {**base, "auc": None, "p_value": None,
                "reason": f"needs at least {min_per_class} examples of each class (got {n_pos} positive, "
                          f"{n_neg} negative)"}
    if base["n_groups"] < 2:
        return {**base, "auc": None, "p_value": None, "reason": "needs at least 2 query groups"}
    rng = np.random.default_rng(seed)
    with sklearn.config_context(assume_finite=True, skip_parameter_validation=True):  # ~1000 small fits
        auc = roc_auc(y, oof_scores(X, y, groups, n_splits))
        null = [roc_auc(yp, oof_scores(X, yp, groups, n_splits)) for yp in (rng.permutation(y) for _ in range(n_perm))]
    # AUCs are multiples of 1 / (2 n_pos n_neg); roc_auc_score's sum can leave an equal AUC an ulp apart
    p = (1 + sum(a >= auc - 1e-12 for a in null)) / (1 + n_perm)
    return {**base, "auc": auc, "p_value": float(p), "n_permutations": n_perm,
            "n_splits": min(n_splits, base["n_groups"])}


FEATURE_NAMES = (
    "n_results", "snippet_chars_mean", "snippet_chars_min", "snippet_chars_max", "title_chars_mean",
    "total_chars", "url_chars_mean", "n_domains", "share_wikipedia", "share_org_gov_edu", "share_with_year",
    "digit_density", "query_snippet_overlap_mean", "query_snippet_overlap_max", "query_title_overlap_mean",
    "query_title_overlap_max", "task_snippet_overlap_mean", "query_words",
)
_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def _jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


def surface_features(item) -> np.ndarray:
    """18 shallow, content-agnostic features of an item's results (see FEATURE_NAMES)."""
    res = item.results
    snip = [len(r["snippet"]) for r in res]
    title = [len(r["title"]) for r in res]
    hosts = [urlparse(r["url"]).netloc.lower() for r in res]
    q, task = _words(item.query), _words(item.task)
    all_snip = " ".join(r["snippet"] for r in res)
    qs = [_jaccard(q, _words(r["snippet"])) for r in res]
    qt = [_jaccard(q, _words(r["title"])) for r in res]
    ts = [_jaccard(task, _words(r["snippet"])) for r in res]
    return np.asarray([
        len(res), np.mean(snip), min(snip), max(snip), np.mean(title),
        sum(snip) + sum(title), np.mean([len(r["url"]) for r in res]), len(set(hosts)),
        np.mean(["wikipedia.org" in h for h in hosts]),
        np.mean([h.endswith((".org", ".gov", ".edu")) or ".gov." in h or ".edu." in h for h in hosts]),
        np.mean([bool(re.search(r"\b(1[5-9]|20)\d\d\b", r["snippet"] + r["title"])) for r in res]),
        sum(ch.isdigit() for ch in all_snip) / max(1, len(all_snip)),
        np.mean(qs), max(qs), np.mean(qt), max(qt), np.mean(ts), len(item.query.split()),
    ], dtype=np.float64)
