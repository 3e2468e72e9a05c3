"""Tokenizers with other families' chat templates (Llama 3, Qwen) on the bundled model's vocabulary, for tests
that check a rule holds whatever the template."""

from __future__ import annotations

import copy
from pathlib import Path

TEMPLATES = Path(__file__).parent / "templates"


def template_tokenizers(tokenizer) -> dict:
    """{"smollm2": the tokenizer, "llama3": a copy with Llama 3's template, "qwen": with Qwen's}."""
    out = {"smollm2": tokenizer}
    for name in ("llama3", "qwen"):
        tok = copy.deepcopy(tokenizer)
        tok.chat_template = (TEMPLATES / f"{name}.jinja").read_text()
        out[name] = tok
    return out


QWEN = Path(__file__).parent.parent / "data" / "chat_templates"  # real templates, sources in its README.md


def qwen_tokenizers(tokenizer) -> dict:
    """{"qwen2.5", "qwen3", "qwen3.5"}: copies of ``tokenizer`` with the real Qwen templates of
    tests/data/chat_templates/ (the bundled SmolLM2 tokenizer shares Qwen's ChatML markers)."""
    out = {}
    for name in ("qwen2.5", "qwen3", "qwen3.5"):
        tok = copy.deepcopy(tokenizer)
        tok.chat_template = (QWEN / f"{name}.jinja").read_text(encoding="utf-8")
        out[name] = tok
    return out
