"""Scoring a final answer: seed 004's exact match (EM) and seed 002's LLM judge (F.5).

EM (seed 004 §3.1): :func:`attnprobe.agents.answers.exact_match`, the one scorer the runner uses too
(Search-R1's ``em_check`` with SQuAD's ``normalize_answer``; no accent folding).

Judge (seed 002 §F.5): an OpenAI-compatible endpoint asked with :data:`prompts.JUDGE_PROMPT`;
``correct: yes|no`` and ``confidence`` (100 when absent) are read from its reply. Offline, ``exact``
scores the extracted answer by EM instead, and every record says which scorer was used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from attnprobe.agents.answers import exact_match
from attnprobe.io.urls import check_url, show_url
from attnprobe.studies.loop.prompts import JUDGE_PROMPT

_EXACT = re.compile(r"exact\s+answer\s*:\s*(.+)", re.I)
_CONFIDENCE = re.compile(r"confidence\s*:\s*(\d{1,3})\s*%?", re.I)


def extract_answer(response: str) -> str:
    """The ``Exact Answer:`` line of a seed-002 style response (its first line), else the whole text."""
    m = _EXACT.search(response or "")
    return m.group(1).strip().splitlines()[0].strip() if m else (response or "").strip()


def extract_confidence(text: str) -> int:
    """``Confidence: N%`` in ``text``, clipped to 0..100; 100 when absent (F.5: "Put 100 if there is no
    confidence score available")."""
    m = _CONFIDENCE.search(text or "")
    return min(100, int(m.group(1))) if m else 100


@dataclass
class Verdict:
    correct: bool | None
    scorer: str  # "em" | "judge:<model>"
    extracted: str | None = None
    confidence: int | None = None
    raw: str | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None or k == "correct"}


def scorer_label(spec: str) -> str:
    """What a result's correctness was decided by: ``em`` (offline) or ``judge:<model>``."""
    return "em" if spec == "exact" else f"judge:{spec.rpartition(':')[2]}"


class Scorer:
    """``exact`` (offline EM, labelled ``em``) or ``openai:BASE_URL:MODEL`` (seed 002's F.5 judge)."""

    def __init__(self, spec: str = "exact", *, timeout: float = 120.0):
        self.spec = spec
        self._chat = None
        self.label = scorer_label(spec)
        if spec == "exact":
            return
        kind, _, rest = spec.partition(":")
        base, _, model = rest.rpartition(":")
        if kind != "openai" or not base or not model:
            raise ValueError(f"--judge {show_url(spec)}: use 'exact' or 'openai:BASE_URL:MODEL'")
        check_url(base, f"--judge {show_url(spec)}: BASE_URL")
        self.base_url, self.model, self.timeout = base, model, timeout

    def _judge_chat(self):
        if self._chat is None:
            from attnprobe.generation.factory import open_backend

            self._chat = open_backend("openai", base_url=self.base_url, served_model=self.model,
                                      timeout=self.timeout)
        return self._chat

    def __call__(self, question: str, response: str | None, answer: str | None, answers: list[str]) -> Verdict:
        if self.label == "em" or not answers:
            return Verdict(exact_match(answer, answers), "em", extracted=answer)
        reply = self._judge_chat().complete([{"role": "user", "content": JUDGE_PROMPT.format(
            question=question, response=response or "", correct_answer=answers[0])}], max_new_tokens=1024)
        text = (reply.content or "").replace("**", "")
        verdicts = re.findall(r"correct\s*:\s*(yes|no)", text, re.I)
        m = re.search(r"extracted_final_answer\s*:\s*(.+)", text)
        return Verdict(bool(verdicts) and verdicts[-1].lower() == "yes", self.label,
                       extracted=m.group(1).strip() if m else None, confidence=extract_confidence(text), raw=text)
