"""The one exact-match scorer of a final answer, shared by the NIS-Agent runner and the in-the-loop study.

EM (seed 004 §3.1): "Exact Match (EM) (Song et al., 2025; Jin et al., 2025), a standard string-matching
metric that checks whether y ≡ ŷ". The normalisation is that of the cited work: Search-R1's
``verl/utils/reward_score/qa_em.py`` (``normalize_answer``, the SQuAD v1.1 evaluation script's):
``white_space_fix(remove_articles(remove_punc(lower(s))))``, where ``remove_punc`` drops every
character of ``string.punctuation``, ``remove_articles`` replaces ``\\b(a|an|the)\\b`` by a space and
``white_space_fix`` joins ``s.split()`` with single spaces; ``em_check`` is 1 when the normalised
prediction equals any normalised golden answer. Accents are NOT folded (neither script does): "Zürich"
does not match "Zurich". One deviation from ``em_check``: a prediction that normalises to '' (e.g. "The.")
is never correct. Before issue 26 the runner also stripped accents (NFKD + ASCII) and removed
``[^\\w\\s]``; its numbers on accented answers may differ.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from typing import Any

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: Any) -> str:
    """Search-R1 / SQuAD ``normalize_answer``: lower case, punctuation removed, a/an/the removed,
    whitespace collapsed."""
    s = "".join(ch for ch in str(text).lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match(prediction: str | None, answers: Iterable[Any] | str | None) -> bool | None:
    """Search-R1's ``em_check``: True when the normalised prediction equals any normalised gold answer;
    None when there is no gold answer (unscored); False for no prediction or one that normalises to ''."""
    golds = [answers] if isinstance(answers, str) else list(answers or [])
    if not golds:
        return None
    if prediction is None:
        return False
    p = normalize_answer(prediction)
    return bool(p) and any(p == normalize_answer(g) for g in golds)
