"""Render a trajectory with the model's chat template and label every token.

Strategy: render the messages to text with ``apply_chat_template``, locate each message part
(system text, task text, reasoning, each tool call, each observation) in that text in order,
tokenize with character offsets, and give every token the role/author/turn of the part that
covers it. Text between parts (markers, injected defaults, the generation prompt) is ``template``.

Templates differ in what they keep. We try renderings from most to least faithful and take the
first in which every part is found: ``native``; ``native+reasoning-in-content`` (for templates
that drop ``reasoning_content``); ``text`` (the smolagents-style serialization: ``Calling tools:``
plus the calls as JSON in the assistant text, observations as ``Call id: ...`` user messages).
Parts are never silently lost: if no rendering locates every part, we raise with the message index.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnprobe.errors import RenderError, TooLongError
from attnprobe.render.brackets import bracket_end
from attnprobe.render.pieces import encode, piece_cuts
from attnprobe.render.segments import QueryPoint, Segment
from attnprobe.trajectory.schema import Trajectory, call_arguments, message_text

RENDERINGS = ("native", "native+reasoning-in-content", "text")


@dataclass
class Part:
    """One piece of a message that must appear in the rendered text."""

    message_index: int
    name: str
    role: str
    author: str
    turn: int
    literal: str | None = None  # exact text to find; None for natively serialized tool calls
    call: dict | None = None  # the tool call, for native locating
    # (s, e, role, author, name, turns after the part's own: an annotation's ``turn``, 0 otherwise)
    subspans: list[tuple[int, int, str, str, str, int]] = field(default_factory=list)
    span: tuple[int, int] | None = None
    # tool-call argument values to label as their own sub-parts: (argument, value, role, author, name);
    # resolved to ``subspans`` once the call is located in the rendered text
    arg_marks: list[tuple[str, str, str, str, str]] = field(default_factory=list)


@dataclass
class Rendered:
    """A tokenized trajectory with one label per token."""

    text: str
    input_ids: np.ndarray
    offsets: np.ndarray
    segments: list[Segment]
    token_segment: np.ndarray
    queries_reasoning: list[QueryPoint]
    decision: QueryPoint
    rendering: str
    template_hash: str
    add_generation_prompt: bool
    messages: list[dict]
    tried: dict[str, str] = field(default_factory=dict)
    truncated_from: int | None = None  # original token count when truncated on request

    @property
    def num_turns(self) -> int:
        return 1 + max(s.turn for s in self.segments)


def message_turns(messages: list[dict]) -> list[int]:
    """Turn of every message: each assistant message after the first starts a new turn, and a message whose
    ``annotations`` span later turns (``turn``: one Search-R1 sequence) moves the next ones on by as many."""
    turn, seen_assistant, out = 0, False, []
    for msg in messages:
        if msg["role"] == "assistant":
            if seen_assistant:
                turn += 1
            seen_assistant = True
        out.append(turn)
        turn += max((int(a.get("turn", 0)) for a in msg.get("annotations") or []), default=0)
    return out


def _args_dict(call: dict) -> dict:
    return call_arguments(call)


def _annotated(part: Part, msg: dict) -> Part:
    """Relabel character spans of a message's content (``annotations``) as their own sub-parts."""
    for j, ann in enumerate(msg.get("annotations") or []):
        part.subspans.append((ann["start"], ann["end"], ann["role"], ann.get("author", "external"), f"annotation[{j}]",
                              int(ann.get("turn", 0))))
    return part


def _call_marks(call: dict, args: dict, where: str) -> list[tuple[str, str, str, str, str]]:
    """``annotations`` of a tool call (``[{"argument": "query", "role": ..., "author": ...}]``): the
    value of that argument becomes its own segment, named ``<where>.arguments.<argument>``."""
    marks = []
    for ann in call.get("annotations") or []:
        name = ann.get("argument")
        value = args.get(name)
        if not isinstance(value, str) or not value:
            raise RenderError(f"{where}: annotation of argument {name!r}, which is not a non-empty string argument")
        marks.append((name, value, ann.get("role", "tool_call"), ann.get("author", "self"),
                      f"{where}.arguments.{name}"))
    return marks


def _resolve_marks(text: str, part: Part) -> None:
    """Find each marked argument value inside the located call (raw, or JSON-escaped as templates write it)."""
    s, e = part.span
    body = text[s:e]
    for _arg, value, role, author, name in part.arg_marks:
        for lit in (value, json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1]):
            at = body.find(lit)
            if at >= 0:
                part.subspans.append((at, at + len(lit), role, author, name, 0))
                break
        else:
            raise RenderError(f"message {part.message_index} ({name}): argument value not found inside the "
                              f"rendered tool call")


def _text_parts(i: int, msg: dict, turn: int, role: str, author: str) -> list[Part]:
    text = message_text(msg.get("content"))
    author = msg.get("author", author)
    if not text.strip():
        return []
    return [_annotated(Part(i, "content", role, author, turn, literal=text), msg)]


def _message_parts(messages: list[dict], mode: str) -> tuple[list[dict], list[Part]]:
    """The message list to hand the template under ``mode`` and the parts to locate in its output."""
    turns = message_turns(messages)
    out_msgs: list[dict] = []
    parts: list[Part] = []
    for i, msg in enumerate(messages):
        role, turn = msg["role"], turns[i]
        if role in ("system", "user"):
            parts += _text_parts(i, msg, turn, "system" if role == "system" else "task", "external")
            new = {k: v for k, v in msg.items() if k not in ("annotations", "author")}
            new["content"] = message_text(msg.get("content"))
            out_msgs.append(new)
            continue
        if role == "assistant":
            author = msg.get("author", "self")
            rc = msg.get("reasoning_content") or ""
            content = message_text(msg.get("content"))
            calls = msg.get("tool_calls") or []
            new = {"role": "assistant"}
            if mode == "native":
                if rc.strip():
                    parts.append(Part(i, "reasoning_content", "reasoning", author, turn, literal=rc))
                    new["reasoning_content"] = rc
                if content.strip():
                    parts.append(_annotated(Part(i, "content", "reasoning", author, turn, literal=content), msg))
                new["content"] = content
            else:
                pieces = []
                if rc.strip():
                    parts.append(Part(i, "reasoning_content", "reasoning", author, turn, literal=rc))
                    pieces.append(rc)
                if content.strip():
                    parts.append(_annotated(Part(i, "content", "reasoning", author, turn, literal=content), msg))
                    pieces.append(content)
                new["content"] = "\n".join(pieces)
            if calls and mode != "text":
                new["tool_calls"] = []
                for j, call in enumerate(calls):
                    fn = {"name": call["function"]["name"], "arguments": _args_dict(call)}
                    new["tool_calls"].append({"id": call.get("id"), "type": "function", "function": fn})
                    parts.append(Part(i, f"tool_calls[{j}]", "tool_call", author, turn, call=fn,
                                      arg_marks=_call_marks(call, fn["arguments"], f"tool_calls[{j}]")))
            elif calls:
                literals = []
                for j, call in enumerate(calls):
                    lit = json.dumps({"id": call.get("id"), "type": "function",
                                      "function": {"name": call["function"]["name"], "arguments": _args_dict(call)}},
                                     ensure_ascii=False)
                    literals.append(lit)
                    parts.append(Part(i, f"tool_calls[{j}]", "tool_call", author, turn, literal=lit,
                                      arg_marks=_call_marks(call, _args_dict(call), f"tool_calls[{j}]")))
                prefix = new["content"] + "\n" if new["content"] else ""
                new["content"] = prefix + "Calling tools:\n[" + ", ".join(literals) + "]"
            out_msgs.append(new)
            continue
        # tool message
        author = msg.get("author", "external")
        text = message_text(msg.get("content"))
        if mode == "text":
            block = f"Call id: {msg.get('tool_call_id') or 'unknown'}\nObservation:\n{text}"
            if out_msgs and out_msgs[-1]["role"] == "user" and out_msgs[-1].get("_from_tool"):
                out_msgs[-1]["content"] += "\n\n" + block
            else:
                out_msgs.append({"role": "user", "content": block, "_from_tool": True})
        else:
            new = {k: v for k, v in msg.items() if k not in ("annotations", "author")}
            new["content"] = text
            out_msgs.append(new)
        if text.strip():
            parts += [Part(i, "content", "observation", author, turn, literal=text)]
    for m in out_msgs:
        m.pop("_from_tool", None)
    return out_msgs, parts


def _find_literal(text: str, literal: str, cursor: int) -> tuple[int, int, int] | None:
    """(start, end, lead) of literal (or its stripped form) at/after cursor; lead = chars stripped on the left."""
    pos = text.find(literal, cursor)
    if pos >= 0:
        return pos, pos + len(literal), 0
    stripped = literal.strip()
    if stripped and stripped != literal:
        pos = text.find(stripped, cursor)
        if pos >= 0:
            return pos, pos + len(stripped), len(literal) - len(literal.lstrip())
    return None


def _find_native_call(text: str, call: dict, cursor: int) -> tuple[int, int] | None:
    """Locate a template-serialized tool call: its name, then every argument value after it."""
    name = call["name"]
    pos = text.find(name, cursor)
    while pos >= 0:
        brace = text.rfind("{", max(cursor, pos - 40), pos)
        start = brace if brace >= 0 else pos
        end = bracket_end(text, brace) if brace >= 0 else None
        if end is None:
            end = pos + len(name)
            probe = pos + len(name)
            ok = True
            for value in call["arguments"].values():
                lit = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
                at = text.find(lit, probe)
                if at < 0:
                    ok = False
                    break
                probe = end = at + len(lit)
            if ok:
                return start, end
        else:
            body = text[start:end]
            if all((v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)) in body
                   or json.dumps(v, ensure_ascii=False) in body for v in call["arguments"].values()):
                return start, end
        pos = text.find(name, pos + 1)
    return None


def _locate(text: str, parts: list[Part]) -> None:
    cursor = 0
    for part in parts:
        if part.literal is not None:
            hit = _find_literal(text, part.literal, cursor)
            if hit is None:
                raise RenderError(f"message {part.message_index} ({part.name}): text not found in the rendered "
                                  f"template output (the template dropped or rewrote it)")
            s, e, lead = hit
            part.span = (s, e)
            if lead:
                part.subspans = [(a - lead, b - lead, *rest) for a, b, *rest in part.subspans]
        else:
            hit2 = _find_native_call(text, part.call, cursor)
            if hit2 is None:
                raise RenderError(f"message {part.message_index} ({part.name}): tool call "
                                  f"{part.call['name']!r} not found in the rendered template output")
            part.span = hit2
        if part.arg_marks:
            _resolve_marks(text, part)
        cursor = part.span[1]


def template_hash(tokenizer) -> str:
    return hashlib.sha256((getattr(tokenizer, "chat_template", None) or "").encode()).hexdigest()[:16]


def _apply_template(tokenizer, messages, tools, add_generation_prompt) -> str:
    kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
    if tools:
        kwargs["tools"] = tools
    return tokenizer.apply_chat_template(messages, **kwargs)


_LONGEST_TOKEN: dict[int, tuple[object, int]] = {}  # id(tokenizer) -> (tokenizer, characters of its longest token)


def longest_token_chars(tokenizer) -> int:
    """The most characters one token of ``tokenizer`` can cover (its longest vocabulary entry; byte-level
    vocabularies spell a byte per character, so this also bounds the characters of decoded text)."""
    key = id(tokenizer)
    hit = _LONGEST_TOKEN.get(key)
    if hit is None or hit[0] is not tokenizer:
        try:
            n = max((len(t) for t in tokenizer.get_vocab()), default=0)
        except Exception:  # noqa: BLE001 - a tokenizer without a vocabulary listing: no early check
            n = 0
        hit = _LONGEST_TOKEN[key] = (tokenizer, n)
    return hit[1]


def check_length(text: str, tokenizer, max_tokens: int | None, what: str) -> None:
    """Refuse ``text`` before tokenizing it when it cannot fit ``max_tokens``: every token covers at most
    :func:`longest_token_chars` characters, so a longer text has more tokens than the limit. (A 10 MB
    observation took 2.8 GB and 48 s to tokenize just to be refused.) Exact limits are checked later,
    on the tokens."""
    longest = longest_token_chars(tokenizer) if max_tokens is not None else 0
    if longest and len(text) > max_tokens * longest:
        raise TooLongError(f"{what} renders to {len(text)} characters, more than {max_tokens} tokens can hold "
                           f"(a token of this tokenizer covers at most {longest}); refused before tokenizing: "
                           "shorten it, raise the limit (--max-tokens) or truncate (--truncate)")


def render(trajectory: Trajectory, tokenizer, *, rendering: str = "auto",
           add_generation_prompt: bool | None = None, max_tokens: int | None = None) -> Rendered:
    """Render, tokenize and segment one trajectory (see module docstring for the fallbacks).

    ``max_tokens``: a rendering whose text certainly holds more tokens (:func:`check_length`) is refused
    with TooLongError before it is tokenized."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise RenderError("the tokenizer has no chat template")
    messages = trajectory.messages
    if add_generation_prompt is None:
        add_generation_prompt = messages[-1]["role"] != "assistant"
    modes = RENDERINGS if rendering == "auto" else (rendering,)
    if rendering != "auto" and rendering not in RENDERINGS:
        raise ValueError(f"rendering must be 'auto' or one of {', '.join(RENDERINGS)}")
    has_rc = any(m.get("reasoning_content") for m in messages)
    tried: dict[str, str] = {}
    too_long: TooLongError | None = None
    for mode in modes:
        if mode == "native+reasoning-in-content" and not has_rc and rendering == "auto":
            continue
        out_msgs, parts = _message_parts(messages, mode)
        try:
            text = _apply_template(tokenizer, copy.deepcopy(out_msgs), trajectory.tools, add_generation_prompt)
            check_length(text, tokenizer, max_tokens, f"trajectory {trajectory.id!r}")
            _locate(text, parts)
            prompt_end = None
            if messages[-1]["role"] == "assistant" and not add_generation_prompt:
                prompt_end = _prompt_end(tokenizer, out_msgs, trajectory.tools, text)
            return _tokenize_and_label(text, parts, tokenizer, mode, out_msgs, add_generation_prompt, tried,
                                       num_messages=len(messages), prompt_end=prompt_end,
                                       cuts=piece_cuts(parts, messages))
        except TooLongError as exc:  # another rendering may be shorter; if none fits, this is the error
            too_long = exc
            continue
        except RenderError as exc:
            tried[mode] = str(exc)
        except Exception as exc:  # a template that raises on this mode (e.g. unknown role 'tool')
            tried[mode] = f"{type(exc).__name__}: {exc}"
    if too_long is not None:
        raise too_long
    detail = "; ".join(f"{m}: {r}" for m, r in tried.items())
    raise RenderError(f"trajectory {trajectory.id!r}: no rendering locates every message part ({detail})")


def _prompt_end(tokenizer, out_msgs, tools, text: str) -> int | None:
    """Characters of ``text`` that the messages before the reply, rendered with the generation prompt,
    make up (what the model read before it wrote the reply); None when that rendering is not a prefix of
    ``text`` (a template that renders history differently once a message follows) or fails."""
    try:
        prefix = _apply_template(tokenizer, copy.deepcopy(out_msgs[:-1]), tools, True)
    except Exception:  # noqa: BLE001 - e.g. a template that refuses a conversation without a user message
        return None
    return len(prefix) if prefix and text.startswith(prefix) else None


def _tokenize_and_label(text, parts, tokenizer, mode, out_msgs, add_generation_prompt, tried,
                        num_messages, prompt_end: int | None = None, cuts: list[int] = ()) -> Rendered:
    ids, offsets = encode(tokenizer, text, list(cuts))  # in pieces where a message lists them (pieces.py)
    # Every character gets the index of the (sub)part covering it, or -1 for template text.
    labels: list[tuple[str, str, int, int, str]] = []  # (role, author, turn, message_index, name)
    children: dict[int, list[int]] = {}  # part label -> its sub-part labels
    char_label = np.full(len(text), -1, dtype=np.int64)
    for part in parts:
        s, e = part.span
        labels.append((part.role, part.author, part.turn, part.message_index, part.name))
        parent = len(labels) - 1
        char_label[s:e] = parent
        for a, b, role, author, name, later in part.subspans:
            labels.append((role, author, part.turn + later, part.message_index, name))
            children.setdefault(parent, []).append(len(labels) - 1)
            char_label[s + a:s + b] = len(labels) - 1
    n = len(ids)
    tok_label = np.full(n, -1, dtype=np.int64)
    for t in range(n):
        s, e = offsets[t]
        if e > s:
            covered = char_label[s:e]
            hit = covered[covered >= 0]
            if hit.size:
                tok_label[t] = hit[0]
    # Parts with no token would vanish silently: refuse.
    present = set(tok_label[tok_label >= 0].tolist())
    for idx, lab in enumerate(labels):
        if idx in present or any(c in present for c in children.get(idx, [])):
            continue
        raise RenderError(f"message {lab[3]} ({lab[4]}): no token covers this part (it merged into a "
                          f"neighbouring token)")
    # Group runs of tokens into segments; template runs take the turn/message of the next part.
    segments: list[Segment] = []
    token_segment = np.empty(n, dtype=np.int64)
    last_turn = max((lab[2] for lab in labels), default=0)
    t = 0
    while t < n:
        lab = tok_label[t]
        u = t + 1
        while u < n and tok_label[u] == lab:
            u += 1
        if lab >= 0:
            role, author, turn, mi, name = labels[lab]
        else:
            nxt = tok_label[u:]
            nxt = nxt[nxt >= 0]
            if nxt.size:
                _, _, turn, mi, _ = labels[nxt[0]]
            else:  # trailing template text: the generation prompt opens the next turn
                mi = -1
                turn = last_turn + 1 if add_generation_prompt else last_turn
            role, author, name = "template", "external", "template"
        token_segment[t:u] = len(segments)
        segments.append(Segment(role, author, int(turn), int(mi), int(t), int(u), name))
        t = u
    queries = []
    first_seen: set[tuple[int, int]] = set()  # (message, turn): a message whose annotations span turns (one
    for seg in segments:                       # Search-R1 sequence) has a reasoning start per turn
        if seg.author == "self" and seg.role in ("reasoning", "tool_call") and \
                (seg.message_index, seg.turn) not in first_seen:
            first_seen.add((seg.message_index, seg.turn))
            # A message that opens with reasoning text is a reasoning step; one that is only tool calls
            # is an action step (seed 002 counts reasoning steps only; analyses filter on the kind).
            kind = "reasoning" if seg.role == "reasoning" else "action"
            queries.append(QueryPoint(seg.start, kind, seg.turn, seg.message_index))
    decision = decision_point(queries, segments, offsets, num_messages, out_msgs, add_generation_prompt, prompt_end)
    return Rendered(text=text, input_ids=ids, offsets=offsets, segments=segments, token_segment=token_segment,
                    queries_reasoning=queries, decision=decision, rendering=mode,
                    template_hash=template_hash(tokenizer), add_generation_prompt=add_generation_prompt,
                    messages=out_msgs, tried=tried)


def decision_point(queries: list[QueryPoint], segments: list[Segment], offsets: np.ndarray, num_messages: int,
                   messages: list[dict], add_generation_prompt: bool, prompt_end: int | None = None) -> QueryPoint:
    """The decision token: the last token before the model's reply, where it decided (DESIGN.md §10).

    A trajectory that ends with an assistant reply (a recorded model call, no generation prompt) decided
    at the last token of its generation prompt: the token that ends at ``prompt_end`` (the characters of
    the messages before the reply rendered with the generation prompt) when a token boundary falls there,
    else the token just before the reply's first own token (reasoning or tool call). With ChatML (SmolLM2)
    and Llama 3 templates both are the reasoning start - 1; a template that opens the reply with its own
    markup (Qwen's ``<think>\n`` before reasoning_content) decides before that markup. Any other trajectory
    (awaiting the model's turn, rendered with the generation prompt) decided at its last token, as does a
    reply with no own token. ``attnprobe counterfactual`` takes the same position
    (:func:`attnprobe.counterfactual.contexts.build_context`). A reply whose annotations span turns (a Search-R1
    sequence, :mod:`attnprobe.agents.searchr1`: earlier replies and observations inline) decided at the token
    before its last turn's first own token, the current reply's reasoning start."""
    n = len(offsets)
    last = num_messages - 1
    if messages and messages[-1].get("role") == "assistant" and not add_generation_prompt:
        starts = [q for q in queries if q.message_index == last]
        if starts and starts[-1].position >= 1:  # the last turn's reply (a Search-R1 sequence has several)
            start = starts[-1].position
            pos = start - 1
            if prompt_end is not None and len(starts) == 1:
                ends = np.flatnonzero(offsets[:start, 1] == prompt_end)
                t = int(ends[-1]) if ends.size else -1
                if t >= 0 and offsets[t + 1, 0] >= prompt_end:  # a token boundary at the prompt's end
                    pos = t
            return QueryPoint(pos, "decision", starts[-1].turn, last)
    return QueryPoint(n - 1, "decision", segments[-1].turn, segments[-1].message_index)
