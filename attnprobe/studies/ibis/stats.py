"""Statistics for IBIS, in numpy only (no scipy/scikit-learn needed at run time).

- :func:`mcnemar_exact`: two-sided exact McNemar test = binomial test of the discordant pairs
  against p = 1/2 (p = min(1, 2 * P[X <= min(b, c)]), X ~ Bin(b + c, 1/2)).
- :func:`bootstrap_ci`: percentile bootstrap over items (paired: one index draw per replicate is
  applied to every array), fixed seed.
- :func:`wilson_ci`: Wilson score interval for a proportion.
- :func:`roc_auc`: Mann-Whitney AUC with ties counted one half.
- :func:`group_kfold` / :func:`grouped_cv_auc`: out-of-fold predictions of an L2 logistic regression
  (standardised features, Newton iterations) with folds that never split a group (a query), pooled
  into one AUC; a label-permutation p-value.
- :func:`surface_features`: 18 shallow features of an item's results (paper appendix A.5).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from urllib.parse import urlparse

import numpy as np


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for b and c discordant pairs (1.0 when b + c == 0)."""
    n, k = int(b) + int(c), min(int(b), int(c))
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    return float(min(1.0, 2.0 * tail))


def wilson_ci(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, centre - half), min(1.0, centre + half))


def bootstrap_ci(stat: Callable[..., float | np.ndarray], *arrays: np.ndarray, n_boot: int = 10000, seed: int = 0,
                 alpha: float = 0.05) -> tuple[np.ndarray | float, np.ndarray | float]:
    """Percentile CI of ``stat(*arrays)`` resampling the first axis (items) jointly across arrays."""
    arrays = tuple(np.asarray(a) for a in arrays)
    n = len(arrays[0])
    if n == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    reps = np.stack([np.asarray(stat(*(a[idx] for a in arrays)), dtype=np.float64)
                     for idx in rng.integers(0, n, size=(n_boot, n))])
    lo, hi = np.quantile(reps, [alpha / 2, 1 - alpha / 2], axis=0)
    return (float(lo), float(hi)) if np.ndim(lo) == 0 else (lo, hi)


def bootstrap_mean_ci(x: np.ndarray, n_boot: int = 10000, seed: int = 0, alpha: float = 0.05):
    """Fast vectorised percentile CI of the mean over the first axis (any trailing shape)."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    if n == 0:
        nan = np.full(x.shape[1:], np.nan)
        return nan, nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    flat = x.reshape(n, -1)
    means = np.empty((n_boot, flat.shape[1]))
    for start in range(0, n_boot, 1000):
        sl = idx[start:start + 1000]
        means[start:start + 1000] = flat[sl].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2], axis=0)
    return lo.reshape(x.shape[1:]), hi.reshape(x.shape[1:])


def roc_auc(y: Sequence[int], score: Sequence[float]) -> float:
    """AUC = P(score_pos > score_neg) + 0.5 P(tie); NaN without both classes."""
    y = np.asarray(y, dtype=int)
    s = np.asarray(score, dtype=np.float64)
    pos, neg = s[y == 1], s[y == 0]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    sorted_s = s[order]
    i = 0
    while i < len(s):  # average ranks for ties
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1
        i = j + 1
    r_pos = ranks[y == 1].sum()
    return float((r_pos - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def group_kfold(groups: Sequence, n_splits: int) -> list[np.ndarray]:
    """Test-index arrays of ``n_splits`` folds; a group never straddles folds (largest groups
    first, each to the currently smallest fold; deterministic)."""
    groups = np.asarray([str(g) for g in groups])
    uniq, counts = np.unique(groups, return_counts=True)
    n_splits = min(n_splits, len(uniq))
    if n_splits < 2:
        raise ValueError("grouped cross-validation needs at least 2 groups")
    order = sorted(range(len(uniq)), key=lambda i: (-counts[i], uniq[i]))
    fold_of, sizes = {}, [0] * n_splits
    for i in order:
        f = int(np.argmin(sizes))
        fold_of[uniq[i]] = f
        sizes[f] += counts[i]
    return [np.flatnonzero([fold_of[g] == f for g in groups]) for f in range(n_splits)]


def fit_logistic(X: np.ndarray, y: np.ndarray, l2: float = 1.0, iters: int = 50) -> tuple[np.ndarray, float]:
    """L2-penalised logistic regression (intercept unpenalised) by Newton's method."""
    n, d = X.shape
    Xb = np.hstack([X, np.ones((n, 1))])
    w = np.zeros(d + 1)
    pen = np.full(d + 1, l2)
    pen[-1] = 0.0
    for _ in range(iters):
        z = np.clip(Xb @ w, -30, 30)
        p = 1 / (1 + np.exp(-z))
        grad = Xb.T @ (p - y) + pen * w
        hess = (Xb * (p * (1 - p))[:, None]).T @ Xb + np.diag(pen) + 1e-9 * np.eye(d + 1)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w[:-1], float(w[-1])


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
    auc = roc_auc(y, oof_scores(X, y, groups, n_splits))
    rng = np.random.default_rng(seed)
    null = [roc_auc(yp, oof_scores(X, yp, groups, n_splits)) for yp in (rng.permutation(y) for _ in range(n_perm))]
    p = (1 + sum(a >= auc for a in null)) / (1 + n_perm)
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
