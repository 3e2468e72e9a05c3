"""Shallow surface features of an IBIS item's results (paper appendix A.5): can they predict flips?"""

from __future__ import annotations

import re
from urllib.parse import urlparse

import numpy as np

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
