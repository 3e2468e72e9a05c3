"""Context policies: what a context-management method would have shown the model before step t.

A policy maps the messages before a step (the *prefix*) to a new message list and records, for
every original message, what it did to it (:data:`STATUSES`). Policies are plain callables
``messages -> Counterfactual`` so users can write their own (:func:`make_policy`) and chain them
(:func:`compose`). None of the shipped policies touches a system or user message (the system
prompt and the task stay as they were); they edit only assistant turns and tool observations.

Seed 002, section 2.2 (observation masking): "Observation masking replaces older observation content
with fixed placeholders while retaining tool-call structure and exempting tool-call errors. The
retention window K preserves the most recent observations; error observations remain available for
adaptive debugging. Placeholders preserve which tool was called and its arguments."

Seed 004, section 3.2 (context interference, on the history state s_i = [x, a_0..a_{i-1}, o_1..o_i]
with a_i = (p_i thought, q_i query)): "IRCoT-o (w/o o_{:-1}) only incorporates the latest observation
o_i"; "IRCoT-oq (w/o o_{:-1}, q_{:-1}) with context [x, p_0, p_1, ..., p_{i-1}, q_{i-1}, o_i]";
"IRCoT-oqp (w/o o_{:-1}, q_{:-1}, p_{:-1}) relies exclusively on the latest thinking, search query,
and observation as context [x, p_{i-1}, q_{i-1}, o_i]". Section 3.3 (refinement): a refiner F keeps
"the most relevant information d~_i = F(q_{i-1}, d_i) to search query q_{i-1} from the latest
retrieved documents d_i", and d~_i is served as the observation o_i.

Mapping onto OpenAI-format trajectories: a thought p is an assistant message's text (``content``
and ``reasoning_content``), a query q its ``tool_calls``, an observation o a ``tool`` message; "the
latest" is the last assistant message of the prefix and the tool messages that answer it (all of
them when it made parallel calls).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from attnprobe.trajectory.schema import call_arguments, message_text

STATUSES = ("kept", "removed", "placeholder", "refined", "calls_removed")
"""What a policy did to an original message: left it, dropped it, replaced its content by a
placeholder, replaced its content by a refiner's output, or dropped its tool calls (the text stays)."""

DEFAULT_PLACEHOLDER = "[Observation omitted to save context. Tool: {name}; arguments: {arguments}]"
"""Placeholder for masked observations; ``str.format`` fields: ``name``, ``arguments`` (the call's
JSON arguments), ``tool_call_id``, ``chars`` and ``lines`` (size of the omitted content)."""

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
    status wins over ``kept``; a removed message stays removed)."""

    def policy(messages: Sequence[dict]) -> Counterfactual:
        msgs, source = list(messages), list(range(len(messages)))
        changes = {i: "kept" for i in range(len(messages))}
        for p in policies:
            cf = p(msgs)
            for k, status in cf.changes.items():
                if status != "kept":
                    changes[source[k]] = status
            source = [source[k] for k in cf.source]
            msgs = cf.messages
        return Counterfactual(msgs, source, changes, policy.name)

    policy.name = name or "+".join(getattr(p, "name", "policy") for p in policies)  # type: ignore[attr-defined]
    return policy


# ------------------------------------------------------------------ helpers on OpenAI messages
def _calls_by_id(messages: Sequence[dict]) -> dict[str, dict]:
    out = {}
    for m in messages:
        for c in m.get("tool_calls") or []:
            if c.get("id"):
                out[c["id"]] = c
    return out


def _arguments_text(call: dict | None) -> str:
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


def _latest_turn(messages: Sequence[dict]) -> tuple[int | None, list[int]]:
    """(index of the last assistant message, indices of the tool messages after it)."""
    last = next((i for i in range(len(messages) - 1, -1, -1) if messages[i]["role"] == "assistant"), None)
    if last is None:
        return None, []
    return last, [j for j in range(last + 1, len(messages)) if messages[j]["role"] == "tool"]


# ------------------------------------------------------------------ seed 002: observation masking
def mask_observations(keep_last: int = 5, *, placeholder: str = DEFAULT_PLACEHOLDER, keep_errors: bool = True,
                      is_error: Callable[[dict], bool] = default_is_error) -> Policy:
    """Seed 002 observation masking: keep the last ``keep_last`` tool observations; replace the
    content of older ones by ``placeholder`` (formatted with the call's tool name and arguments);
    with ``keep_errors`` an observation that reports a failed call is never masked. Every tool
    message counts as one observation (parallel calls give several)."""
    if keep_last < 0:
        raise ValueError("mask_observations: keep_last must be >= 0")

    def edits(messages: Sequence[dict]) -> dict[int, Edit]:
        calls = _calls_by_id(messages)
        tools = [i for i, m in enumerate(messages) if m["role"] == "tool"]
        older = tools[: max(0, len(tools) - keep_last)]
        out: dict[int, Edit] = {}
        for i in older:
            msg = messages[i]
            if keep_errors and is_error(msg):
                continue
            call = calls.get(msg.get("tool_call_id") or "")
            name = (call or {}).get("function", {}).get("name") or msg.get("name") or "unknown"
            text = message_text(msg.get("content"))
            new = {k: v for k, v in msg.items() if k not in ("annotations",)}
            new["content"] = placeholder.format(name=name, arguments=_arguments_text(call),
                                                tool_call_id=msg.get("tool_call_id") or "", chars=len(text),
                                                lines=text.count("\n") + 1 if text else 0)
            out[i] = ("placeholder", new)
        return out

    return make_policy(f"mask:{keep_last}", edits)


# ------------------------------------------------------------------ seed 004: IRCoT variants
IRCOT_VARIANTS = ("o", "oq", "oqp")


def ircot(variant: str = "o") -> Policy:
    """Seed 004 section 3.2: ``o`` drops every observation but the latest; ``oq`` also drops the tool
    calls (queries) of earlier assistant turns, keeping their thoughts; ``oqp`` also drops earlier
    thoughts, so only the latest assistant turn and its observations remain. An earlier assistant
    message with no text left is removed whole."""
    if variant not in IRCOT_VARIANTS:
        raise ValueError(f"ircot variant must be one of {', '.join(IRCOT_VARIANTS)}, not {variant!r}")

    def edits(messages: Sequence[dict]) -> dict[int, Edit]:
        last, latest_obs = _latest_turn(messages)
        if last is None:
            return {}
        out: dict[int, Edit] = {}
        for i, m in enumerate(messages[:last]):
            if m["role"] == "tool":
                out[i] = ("removed", None)
            elif m["role"] == "assistant" and variant == "oqp":
                out[i] = ("removed", None)
            elif m["role"] == "assistant" and variant == "oq" and m.get("tool_calls"):
                has_text = message_text(m.get("content")).strip() or (m.get("reasoning_content") or "").strip()
                if has_text:
                    out[i] = ("calls_removed", {k: v for k, v in m.items() if k != "tool_calls"})
                else:
                    out[i] = ("removed", None)
        return out

    return make_policy(f"ircot:{variant}", edits)


# ------------------------------------------------------------------ seed 004: refine the latest observation
Refiner = Callable[[str, str], str]
"""``refiner(query, document) -> refined document`` (seed 004's F(q_{i-1}, d_i))."""


def refine_query(messages: Sequence[dict], last: int, observation: dict) -> str:
    """The query a refiner selects against: the ``query`` argument of the call this observation
    answers, else every argument value plus the latest thought (a visit_page URL alone says little)."""
    calls = _calls_by_id(messages)
    call = calls.get(observation.get("tool_call_id") or "")
    if call is None:
        cs = messages[last].get("tool_calls") or []
        call = cs[0] if len(cs) == 1 else None
    args: Any = {}
    if call:
        args = call_arguments({"arguments": _arguments_text(call)}, on_error="raw")
    if isinstance(args, dict) and isinstance(args.get("query"), str):
        return args["query"]
    thought = " ".join(x for x in (messages[last].get("reasoning_content") or "",
                                   message_text(messages[last].get("content"))) if x)
    values = " ".join(str(v) for v in (args.values() if isinstance(args, dict) else [args]))
    return f"{values} {thought}".strip()


def refine_latest(refiner: Refiner, *, name: str = "refine") -> Policy:
    """Seed 004 section 3.3: replace each latest observation d_i by ``refiner(q_{i-1}, d_i)``
    (status ``refined``; ``kept`` when the refiner returns the text unchanged)."""

    def edits(messages: Sequence[dict]) -> dict[int, Edit]:
        last, latest_obs = _latest_turn(messages)
        out: dict[int, Edit] = {}
        for i in latest_obs:
            msg = messages[i]
            text = message_text(msg.get("content"))
            new_text = refiner(refine_query(messages, last, msg), text)
            if not isinstance(new_text, str):
                raise TypeError(f"refiner returned {type(new_text).__name__}, expected str")
            if new_text != text:
                new = {k: v for k, v in msg.items() if k != "annotations"}
                new["content"] = new_text
                out[i] = ("refined", new)
        return out

    return make_policy(name, edits)


# ------------------------------------------------------------------ the CLI's policy names
def parse_policy(spec: str) -> Policy:
    """``mask:K`` | ``ircot:o`` | ``ircot:oq`` | ``ircot:oqp`` | ``refine:bm25[:N]`` (keep the N best
    sentences, default 3) | ``refine:openai:BASE_URL:MODEL`` (an OpenAI-compatible refiner)."""
    from attnprobe.counterfactual.refiners import bm25_refiner, openai_refiner

    kind, _, arg = spec.partition(":")
    if kind == "mask":
        try:
            k = int(arg)
        except ValueError:
            raise ValueError(f"policy {spec!r}: mask needs a number, e.g. mask:5") from None
        return mask_observations(k)
    if kind == "ircot":
        return ircot(arg)
    if kind == "refine":
        sub, _, rest = arg.partition(":")
        if sub == "bm25":
            n = int(rest) if rest else 3
            return refine_latest(bm25_refiner(n), name=f"refine:bm25:{n}")
        if sub == "openai":
            base, _, model = rest.rpartition(":")
            if not base or not model:
                raise ValueError(f"policy {spec!r}: use refine:openai:BASE_URL:MODEL")
            return refine_latest(openai_refiner(base, model), name=f"refine:openai:{model}")
    raise ValueError(f"unknown policy {spec!r}: use mask:K, ircot:o|oq|oqp, refine:bm25[:N] or "
                     f"refine:openai:BASE_URL:MODEL")


def policy_name(policy: Policy) -> str:
    return getattr(policy, "name", None) or getattr(policy, "__name__", "policy")
