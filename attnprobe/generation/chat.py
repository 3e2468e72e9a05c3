"""The one reply type and the protocol every generation backend follows.

Backends (see :mod:`attnprobe.generation.factory`): in-process transformers
(:mod:`attnprobe.generation.transformers_chat`) and any OpenAI-compatible endpoint
(:mod:`attnprobe.generation.openai_chat`). Both return a :class:`ChatReply` with parsed tool calls
and token counts, so every call can be recorded as a trajectory exactly as sent and received.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class Prompt:
    """The prompt exactly as an in-process model saw it."""

    ids: list[int]
    text: str
    rendering: str  # the render mode that was used (native, text, ...)


@dataclass
class ChatReply:
    content: str
    tool_calls: list[dict] = field(default_factory=list)  # OpenAI format, arguments as JSON strings
    raw_text: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str = "stop"  # OpenAI semantics: tool_calls | length | stop (or what a server said)
    # Why in-process generation ended: "eos" (the tokenizer's end-of-sequence token came last),
    # "length" (max_tokens reached) or "other" (the stop-at-call rule or another stop token);
    # "" when unknown (a server's reply).
    stopped_by: str = ""
    prompt: Prompt | None = None  # in-process backends only

    def as_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


class ChatBackend(Protocol):
    kind: str  # the factory's registry key: "transformers" | "openai"
    name: str  # the model name recorded with every call

    def complete(self, messages: list[dict], tools: list[dict] | None = None, *, max_tokens: int = 256,
                 temperature: float = 0.0) -> ChatReply: ...


def tool_names(tools: list[dict] | None) -> list[str] | None:
    """Names of the offered tools (OpenAI tool schema), or None when no tools are offered."""
    return [t["function"]["name"] for t in tools] if tools else None
