"""Answer normalisation and scoring (normalised exact match), shared by scoring and validation."""

from __future__ import annotations

import re
import unicodedata
from typing import Any


def normalize(text: Any) -> str:
    """Lower case, accents and punctuation removed, articles dropped, whitespace collapsed."""
    s = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode().lower()
    s = re.sub(r"[^\w\s]", "", s)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def is_correct(prediction: str, question: dict) -> bool | None:
    gold = question.get("answer")
    if gold is None:
        return None
    golds = (gold if isinstance(gold, list) else [gold]) + list(question.get("aliases") or [])
    p = normalize(prediction)
    return bool(p) and any(p == normalize(g) for g in golds)
