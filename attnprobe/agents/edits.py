"""The one policy interface, below every policy: a policy maps the messages before a step to a
:class:`Counterfactual` (the new message list and, per original message, what it did to it). Policies
are plain callables so users write their own (:func:`make_policy`) and chain them (:func:`compose`);
the shipped ones are in :mod:`attnprobe.agents.masking` (seed 002) and :mod:`attnprobe.agents.policies`
(seed 004, and the names the CLI parses)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from attnprobe.trajectory.schema import message_text

STATUSES = ("kept", "removed", "placeholder", "refined", "calls_removed")
"""What a policy did to an original message: left it, dropped it, replaced its content by a
placeholder, replaced its content by a refiner's output, or dropped its tool calls (the text stays)."""

_ERROR_TEXT = re.compile(r"^\s*(error\b|exception\b|traceback\b|\[error\]|tool error|failed to\b)", re.I)


@dataclass
class Counterfactual:
    """A policy's output: the new prefix and, per original message, what happened to it.

    ``messages[k]`` comes from original message ``source[k]``; ``changes[i]`` is the status of
    original message ``i`` (every index of the input appears once)."""

    messages: list[dict]
    source: list[int]
    changes: dict[int, str]
    policy: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def indices(self, *statuses: str) -> list[int]:
        return sorted(i for i, s in self.changes.items() if s in statuses)

    @property
    def changed(self) -> bool:
        return any(s != "kept" for s in self.changes.values())

    def to_dict(self) -> dict:
        return {"policy": self.policy, "source": list(self.source),
                "changes": {str(i): s for i, s in sorted(self.changes.items())}, "details": self.details}


Policy = Callable[[Sequence[dict]], Counterfactual]
"""The one policy interface: the prefix messages in, a :class:`Counterfactual` out. The callable's
``name`` attribute (set by :func:`make_policy`) names its result folder."""

Edit = tuple[str, "dict | None"]  # (status, new message or None when removed)


def apply_edits(messages: Sequence[dict], edits: Mapping[int, Edit], *, policy: str = "",
                details: dict | None = None) -> Counterfactual:
    """Build a :class:`Counterfactual` from ``{original index: (status, new message)}``; unlisted
    messages are kept as they are (deep copies)."""
    out, source, changes = [], [], {}
    for i, msg in enumerate(messages):
        status, new = edits.get(i, ("kept", None))
        if status not in STATUSES:
            raise ValueError(f"policy {policy!r}: unknown status {status!r} for message {i} (one of {STATUSES})")
        if status == "removed":
            changes[i] = status
            continue
        if status != "kept" and new is None:
            raise ValueError(f"policy {policy!r}: status {status!r} for message {i} needs a new message")
        changes[i] = status
        out.append(copy.deepcopy(msg if status == "kept" else new))
        source.append(i)
    return Counterfactual(out, source, changes, policy, details or {})


def make_policy(name: str, edits_fn: Callable[[Sequence[dict]], Mapping[int, Edit]]) -> Policy:
    """A user-written policy from a function ``messages -> {index: (status, new message | None)}``."""

    def policy(messages: Sequence[dict]) -> Counterfactual:
        return apply_edits(messages, edits_fn(messages), policy=name)

    policy.name = name  # type: ignore[attr-defined]
    return policy


def compose(*policies: Policy, name: str | None = None) -> Policy:
    """Apply policies in order; changes are mapped back onto the original indices (a later policy's
    status wins over ``kept``; a removed message stays removed). ``details["refined"]`` entries are
    mapped back too and kept for messages whose final status is ``refined``."""

    def policy(messages: Sequence[dict]) -> Counterfactual:
        msgs, source = list(messages), list(range(len(messages)))
        changes = {i: "kept" for i in range(len(messages))}
        refined: dict[str, dict] = {}
        for p in policies:
            cf = p(msgs)
            for k, status in cf.changes.items():
                if status != "kept":
                    changes[source[k]] = status
            for k, v in (cf.details.get("refined") or {}).items():
                refined[str(source[int(k)])] = v
            source = [source[k] for k in cf.source]
            msgs = cf.messages
        refined = {k: v for k, v in refined.items() if changes[int(k)] == "refined"}
        return Counterfactual(msgs, source, changes, policy.name, {"refined": refined} if refined else {})

    policy.name = name or "+".join(getattr(p, "name", "policy") for p in policies)  # type: ignore[attr-defined]
    return policy


# ------------------------------------------------------------------ helpers on OpenAI messages
def calls_by_id(messages: Sequence[dict]) -> dict[str, dict]:
    out = {}
    for m in messages:
        for c in m.get("tool_calls") or []:
            if c.get("id"):
                out[c["id"]] = c
    return out


def arguments_text(call: dict | None) -> str:
    if not call:
        return "{}"
    args = call.get("function", {}).get("arguments", {})
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def default_is_error(message: dict) -> bool:
    """An observation reports a failed tool call: an explicit flag (``is_error``, ``error``,
    ``status: "error"``) or content that opens with Error / Exception / Traceback / Tool error."""
    if message.get("is_error") or message.get("error") or message.get("status") == "error":
        return True
    return bool(_ERROR_TEXT.match(message_text(message.get("content"))))


def turns_of_observations(messages: Sequence[dict]) -> dict[int, int]:
    """Tool message index -> index of the assistant message it answers (the last assistant message
    before it; -1 for a tool message before any). Parallel calls of one assistant message share it."""
    out, last = {}, -1
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            last = i
        elif m["role"] == "tool":
            out[i] = last
    return out
