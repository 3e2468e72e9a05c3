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
