"""Where the attention on a refined observation was: on the text the refiner dropped, or on the text it kept.

An extractive refiner (seed 004 §3.3, d~_i = F(q_{i-1}, d_i); ours: BM25 sentence selection) keeps some
sentences of the observation verbatim. The counterfactual's "mass on changed messages" counts the whole
original observation, yet most of it can land back on the kept sentences in the refined context (the
"removed mass", on the tokens absent from the counterfactual context, leaves them out). Splitting
the original row's mass on a refined message into ``dropped`` (sentences the refiner left out),
``kept_again`` (sentences it kept) and ``other`` (the message's markers and the whitespace between
sentences) says how much attention the refiner really took away. The three sum to the original mass
on the message (every token it owns, markers included, as in the mass on changed messages).

Input: the original :class:`CaptureResult` and the policy's ``details["refined"]``
(:func:`attnprobe.agents.policies.extractive_selection`: the original sentences and the kept
indices). Pure numpy on stored scores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from attnprobe.results.result import CaptureResult

PARTS = ("dropped", "kept_again", "other")


def sentence_spans(text: str, sentences: Sequence[str], start: int = 0, end: int | None = None
                   ) -> list[tuple[int, int]] | None:
    """Character spans of ``sentences`` found in order inside ``text[start:end]``; None when one is
    missing (a template that escapes the content, or a message the capture truncated)."""
    end = len(text) if end is None else end
    spans, cursor = [], start
    for s in sentences:
        i = text.find(s, cursor, end)
        if i < 0:
            return None
        spans.append((i, i + len(s)))
        cursor = i + len(s)
    return spans


def token_sentences(offsets: np.ndarray, tokens: np.ndarray, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """For each token index in ``tokens``: the sentence whose span it overlaps most, -1 for none."""
    out = np.full(len(tokens), -1, dtype=np.int64)
    for k, t in enumerate(tokens):
        a, b = int(offsets[t][0]), int(offsets[t][1])
        best, best_overlap = -1, 0
        for j, (s, e) in enumerate(spans):
            overlap = min(b, e) - max(a, s)
            if overlap > best_overlap:
                best, best_overlap = j, overlap
        out[k] = best
    return out


def split_mass(row: np.ndarray, labels: np.ndarray, kept: Sequence[int]) -> dict[str, float]:
    """``row``: attention on the message's tokens; ``labels``: their sentence (-1: none); ``kept``:
    the kept sentence indices. {"dropped", "kept_again", "other"} (they sum to ``row.sum()``)."""
    row = np.asarray(row, dtype=np.float64)
    in_kept = np.isin(labels, np.asarray(list(kept), dtype=np.int64))
    return {"dropped": float(row[(labels >= 0) & ~in_kept].sum()), "kept_again": float(row[in_kept].sum()),
            "other": float(row[labels < 0].sum())}


def _message_tokens(result: CaptureResult) -> np.ndarray:
    from attnprobe.counterfactual.analysis import token_messages

    return token_messages(result)


def refined_mass_split(original: CaptureResult, refined: Mapping[str, Mapping], query: int) -> dict:
    """The split of the original row ``query`` over every refined message of ``refined``
    (``Counterfactual.details["refined"]``): ``{"dropped", "kept_again", "other", "split_messages",
    "unsplit": {message: reason}}``. A message that is not extractive or whose sentences cannot be
    located in the rendered text is listed in ``unsplit`` and left out of the three sums."""
    owner = _message_tokens(original)
    row = np.asarray(original.token_attention[query], dtype=np.float64)
    offsets = np.asarray(original.offsets) if original.offsets is not None else None
    total = dict.fromkeys(PARTS, 0.0)
    unsplit: dict[str, str] = {}
    n = 0
    for key, info in sorted(refined.items(), key=lambda kv: int(kv[0])):
        i = int(key)
        if not info.get("extractive"):
            unsplit[key] = "not extractive (the refined text is not a selection of the original sentences)"
            continue
        tokens = np.nonzero(owner == i)[0]
        segs = [s for s in original.segments if s.message_index == i and s.role == "observation"]
        if offsets is None or not len(tokens) or not segs:
            unsplit[key] = "message not in the capture"
            continue
        lo, hi = int(offsets[min(s.start for s in segs)][0]), int(offsets[max(s.end for s in segs) - 1][1])
        spans = sentence_spans(original.text, info["sentences"], lo, hi)
        if spans is None:
            unsplit[key] = "sentences not found verbatim in the rendered text"
            continue
        part = split_mass(row[tokens], token_sentences(offsets, tokens, spans), info["kept"])
        for k in PARTS:
            total[k] += part[k]
        n += 1
    return {**total, "split_messages": n, "unsplit": unsplit}
