"""Segments: contiguous token spans with one role, author, turn and message."""

from __future__ import annotations

from dataclasses import asdict, dataclass

ROLES = ("system", "task", "reasoning", "tool_call", "observation", "template")
AUTHORS = ("self", "external")


@dataclass(frozen=True)
class Segment:
    """A token span [start, end) of the rendered trajectory.

    message_index is the source message (-1 for template text after the last message, e.g. the
    generation prompt); part names the message part ("content", "reasoning_content",
    "tool_calls[0]", "annotation[1]", or "template").
    """

    role: str
    author: str
    turn: int
    message_index: int
    start: int
    end: int
    part: str = "content"

    @property
    def length(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class QueryPoint:
    """A query position with what it stands for (a reasoning start, the decision, or user-chosen)."""

    position: int
    kind: str  # "reasoning" | "action" (a tool-call-only assistant message) | "decision" | "token"
    turn: int
    message_index: int

    def to_dict(self) -> dict:
        return asdict(self)
