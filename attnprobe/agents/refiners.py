"""Refiners for :func:`attnprobe.agents.policies.refine_rounds`: ``(query, document) -> text``.

Seed 004 section 3.3 distils its refiner from a strong LLM; here the shipped refiner is a
deterministic extractive one (BM25 sentence selection with ``bm25s``), so a counterfactual run is
reproducible without a second model. Any callable works, and :func:`openai_refiner` asks an
OpenAI-compatible endpoint.
"""

from __future__ import annotations

import re
from collections.abc import Callable

Refiner = Callable[[str, str], str]  # (query, document) -> refined text; the type policies.refine_rounds takes

_SENTENCE = re.compile(r"(?<=[^\d\s][.!?])\s+(?=[A-Z0-9\[(])|\n+")  # "1. [title]" is not a sentence end

REFINE_PROMPT = ("Keep only the information in the documents below that helps answer the search query. "
                 "Copy the relevant sentences verbatim, with their titles and URLs; drop everything else.\n\n"
                 "Search query: {query}\n\nDocuments:\n{document}")


REFINER_MAX_NEW_TOKENS = 512  # a chat refiner's reply limit (ours; seed 004 gives none)

def split_sentences(text: str) -> list[str]:
    """Lines, then sentences inside a line (numbered result lists keep one result per line)."""
    return [s.strip() for s in _SENTENCE.split(text) if s and s.strip()]


def bm25_refiner(keep: int = 3) -> Refiner:
    """Keep the ``keep`` sentences of the document that score highest against the query under BM25
    (English stopwords removed), in their original order, joined by newlines. Ties keep the earlier
    sentence; a query with no indexed word keeps the first ``keep`` sentences."""
    if keep < 1:
        raise ValueError("bm25_refiner: keep must be >= 1")

    def refine(query: str, document: str) -> str:
        import bm25s
        import numpy as np

        sents = split_sentences(document)
        if len(sents) <= keep:
            return "\n".join(sents)
        corpus = bm25s.tokenize(sents, stopwords="en", show_progress=False)
        index = bm25s.BM25()
        index.index(corpus, show_progress=False)
        q = bm25s.tokenize([query], stopwords="en", show_progress=False, return_ids=False)[0]
        scores = np.asarray(index.get_scores(q), dtype=np.float64) if q else np.zeros(len(sents))
        order = np.lexsort((np.arange(len(sents)), -scores))  # best score first, earlier sentence on ties
        chosen = sorted(order[:keep].tolist())
        return "\n".join(sents[i] for i in chosen)

    refine.__name__ = f"bm25_refiner_{keep}"
    return refine


def chat_refiner(chat, *, prompt: str = REFINE_PROMPT, max_new_tokens: int = REFINER_MAX_NEW_TOKENS) -> Refiner:
    """A refiner that asks any chat backend (``complete(messages)``) to filter the document."""

    def refine(query: str, document: str) -> str:
        reply = chat.complete([{"role": "user", "content": prompt.format(query=query, document=document)}],
                              max_new_tokens=max_new_tokens)
        return (reply.content or reply.raw_text).strip()

    return refine


def openai_refiner(base_url: str, model: str, *, api_key_env: str = "OPENAI_API_KEY", **kwargs) -> Refiner:
    """:func:`chat_refiner` on an OpenAI-compatible endpoint (``attnprobe.generation.openai_chat``)."""
    from attnprobe.generation.openai_chat import OpenAIChat

    return chat_refiner(OpenAIChat(base_url, model, api_key_env=api_key_env), **kwargs)
