"""Seed 002's observation masking (section 2.2, quoted in :mod:`attnprobe.agents.policies`): ``mask:K``
as its released scaffold archives turns (:func:`mask_archive`, i-DeepSearch/observation-masking
tools/context_management.py) and ``mask-obs:K``, which counts observations (:func:`mask_observations`).
Neither touches a system or user message, and error observations are never masked."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from attnprobe.agents.edits import (
    Edit,
    Policy,
    arguments_text,
    calls_by_id,
    default_is_error,
    make_policy,
)
from attnprobe.trajectory.schema import message_text

DEFAULT_PLACEHOLDER = "[Observation omitted to save context. Tool: {name}; arguments: {arguments}]"
"""Placeholder for masked observations; ``str.format`` fields: ``name``, ``arguments`` (the call's
JSON arguments), ``tool_call_id``, ``chars`` and ``lines`` (size of the omitted content)."""


# ------------------------------------------------------------------ seed 002: observation masking
# The rule of the scaffold seed 002 released (github.com/i-DeepSearch/observation-masking,
# tools/context_management.py, ``_auto_archive_old_results``), rewritten here: K counts the assistant turns
# that made at least one non-error browser call; every successful browser result before the K-th most recent
# such turn becomes ``ARCHIVE_MARKER tool=<name> | args: <k=repr(v)[:80], ...>``; error results never do;
# K <= 0 archives nothing (the release's ``if force_archive_after_turns <= 0: return 0``).
ARCHIVE_MARKER = "[Auto-archived browser result]"
ARCHIVE_PLACEHOLDER = ARCHIVE_MARKER + " tool=<name> | args: <k=repr(v)[:80], ...>"
"""How the release's placeholder reads (recorded in study.json and the runner's settings)."""

_RELEASE_ERROR_PREFIXES = ("Error executing ", "Error rendering ", "Error: Invalid arguments for function",
                           "An unexpected error occurred while executing function")


def archive_args(arguments: Any) -> str:
    """The release's ``_args_desc``: a call's arguments (a JSON string or a dict) as ``k=repr(v)[:80]``
    joined by ``", "``; a string that is not JSON is ``{"raw": it}``; no dict or an empty one is ``no args``."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = {"raw": arguments}
    if not isinstance(arguments, dict) or not arguments:
        return "no args"
    return ", ".join(f"{k}={repr(v)[:80]}" for k, v in arguments.items())


def archive_placeholder(name: str, arguments: Any) -> str:
    """The release's ``_auto_archive_placeholder``: ``[Auto-archived browser result] tool=NAME | args: ARGS``."""
    return f"{ARCHIVE_MARKER} tool={name} | args: {archive_args(arguments)}"


def archive_is_error(message: dict) -> bool:
    """An error result as the release knows one: :func:`default_is_error` (our flags and ``Error...``
    texts, which include the release's ``Error executing`` / ``Error rendering`` / ``Error: Invalid
    arguments`` prefixes) or the release's other two signs, ``An unexpected error occurred while executing
    function`` and a JSON object with an ``error`` key."""
    if default_is_error(message):
        return True
    text = message_text(message.get("content")).lstrip()
    if text.startswith(_RELEASE_ERROR_PREFIXES):
        return True
    if text.startswith('{"error"'):
        try:
            parsed = json.loads(text)
        except ValueError:
            return False
        return isinstance(parsed, dict) and "error" in parsed
    return False


def mask_archive(keep_turns: int = 5, *, tools: Sequence[str] | None = None,
                 is_error: Callable[[dict], bool] = archive_is_error) -> Policy:
    """Seed 002 observation masking as its released scaffold does it (``mask:K``).

    K counts *assistant turns* that made at least one non-error call to an archivable tool (parallel calls
    of one reply are one turn; a turn whose calls all failed is no turn). Every successful result of an
    archivable tool that comes before the K-th most recent such turn gets :func:`archive_placeholder`
    (``[Auto-archived browser result] tool=<name> | args: <k=repr(v)[:80], ...>``); error results are never
    archived (seed 002 §2.2, "exempting tool-call errors"); K <= 0 archives nothing, as in the release.
    A result whose call is not in the prefix is left as it is (the release cannot name its tool either).
    ``tools``: the archivable tool names; the release archives its browser tools (search/open/find, all
    its retrieval tools), so None means every tool, which for our scaffolds is their retrieval tools.
    The release archives in place before each model call; recomputing from the full history at every step
    gives the same context, because the set of counted turns only grows. One difference: the release
    decides which turns count from the call ids its runtime marked as failed (results opening with
    ``Error executing`` / ``Error rendering``, arguments that did not parse) and which results to keep from
    those ids plus its content tests; a policy has only the messages, so ``is_error`` decides both (a turn
    whose only result is, say, ``Error: Invalid arguments ...`` counts in the release and not here).
    (The former ``mask-turns:K`` counted the same turns and masked the same results for K >= 1, so it was
    removed; ``mask-obs:K`` keeps the count of observations.)"""
    if keep_turns < 0:
        raise ValueError("mask_archive: keep_turns must be >= 0")
    allowed = None if tools is None else set(tools)

    def archivable(name: str) -> bool:
        return allowed is None or name in allowed

    def edits(messages: Sequence[dict]) -> dict[int, Edit]:
        if keep_turns <= 0:
            return {}
        calls = calls_by_id(messages)
        errors = {m.get("tool_call_id") for m in messages if m["role"] == "tool" and is_error(m)}
        errors.discard(None)
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant" and any(
            archivable(c.get("function", {}).get("name", "")) and c.get("id", "") not in errors
            for c in m.get("tool_calls") or [])]
        if len(turns) < keep_turns:
            return {}
        out: dict[int, Edit] = {}
        for i in range(turns[-keep_turns]):
            msg = messages[i]
            if msg["role"] != "tool":
                continue
            text = message_text(msg.get("content"))
            if ARCHIVE_MARKER in text or text.startswith("[Auto-archived |"):
                continue
            call = calls.get(msg.get("tool_call_id") or "")
            name = (call or {}).get("function", {}).get("name", "")
            if call is None or not archivable(name) or msg.get("tool_call_id") in errors or is_error(msg):
                continue
            new = {k: v for k, v in msg.items() if k != "annotations"}
            new["content"] = archive_placeholder(name, call.get("function", {}).get("arguments", {}))
            out[i] = ("placeholder", new)
        return out

    return make_policy(f"mask:{keep_turns}", edits)


# ------------------------------------------------------------------ mask-obs:K, the observation count
def _placeholder_edit(messages: Sequence[dict], i: int, placeholder: str, calls: dict[str, dict]) -> Edit:
    msg = messages[i]
    call = calls.get(msg.get("tool_call_id") or "")
    name = (call or {}).get("function", {}).get("name") or msg.get("name") or "unknown"
    text = message_text(msg.get("content"))
    new = {k: v for k, v in msg.items() if k not in ("annotations",)}
    new["content"] = placeholder.format(name=name, arguments=arguments_text(call),
                                        tool_call_id=msg.get("tool_call_id") or "", chars=len(text),
                                        lines=text.count("\n") + 1 if text else 0)
    return ("placeholder", new)


def mask_observations(keep_last: int = 5, *, placeholder: str = DEFAULT_PLACEHOLDER, keep_errors: bool = True,
                      is_error: Callable[[dict], bool] = default_is_error) -> Policy:
    """Observation masking with the window counted in observations (``mask-obs:K``; ``mask:K`` before
    issue 26): the last ``keep_last`` tool observations stay; older ones get ``placeholder`` (formatted
    with the call's tool name and arguments; ours, not the release's). Every tool message is one
    observation (parallel calls give several), so it differs from the released rule (:func:`mask_archive`)
    exactly when a turn makes parallel calls. With ``keep_errors`` an observation that reports a failed
    call is never masked and does not use up a window slot."""
    if keep_last < 0:
        raise ValueError("mask_observations: keep_last must be >= 0")

    def edits(messages: Sequence[dict]) -> dict[int, Edit]:
        calls = calls_by_id(messages)
        counted = [i for i, m in enumerate(messages)
                   if m["role"] == "tool" and not (keep_errors and is_error(m))]
        older = counted[: max(0, len(counted) - keep_last)]
        return {i: _placeholder_edit(messages, i, placeholder, calls) for i in older}

    return make_policy(f"mask-obs:{keep_last}", edits)
