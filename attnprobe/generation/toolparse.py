"""Parse the next action out of generated text, whatever tool-call syntax the model used.

Small models rarely follow one format: we accept Qwen/Hermes ``<tool_call>{...}</tool_call>``,
Llama-3 style bare JSON (``{"name": ..., "parameters": ...}``), the smolagents ``Calling tools:
[...]`` list (JSON, or the Python repr that seed 001 appendix E writes: ``[{'id': ..., 'function':
{'name': 'web_search', 'arguments': {'query': ...}}}]``), fenced ```json blocks, ``Action: {...}`` and
Python-call style ``web_search("q")``.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field

from attnprobe.render.rendering import bracket_end
from attnprobe.trajectory.schema import call_arguments

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_FENCED = re.compile(r"```(?:json|tool_call|python)?\s*(.*?)```", re.S)
_PYCALL = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\((.*?)\)", re.S)


@dataclass
class ParsedCall:
    name: str
    arguments: dict = field(default_factory=dict)

    def to_openai(self, call_id: str) -> dict:
        return {"id": call_id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


def call_ids(messages: list[dict], k: int, prefix: str = "call") -> list[str]:
    """Ids for ``k`` new calls parsed from a reply to ``messages``: ``<prefix><n>`` numbered on from the
    calls already in the context. A function of the context alone, so a resumed run gives the same ids
    as an uninterrupted one, and ids stay unique within one conversation."""
    seen = sum(len(m.get("tool_calls") or []) for m in messages if isinstance(m, dict))
    return [f"{prefix}{seen + i + 1}" for i in range(k)]


def _json_objects(text: str) -> list[tuple[int, int, object]]:
    """Every top-level JSON value ({...} or [...]) that parses, with its span."""
    dec = json.JSONDecoder()
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch in "{[":
            try:
                obj, end = dec.raw_decode(text, i)
                out.append((i, end, obj))
                i = end
                continue
            except json.JSONDecodeError:
                pass
        i += 1
    return out


def _python_literals(text: str) -> list[tuple[int, int, object]]:
    """Every top-level Python literal ({...} or [...]) that ``ast.literal_eval`` accepts, with its span
    (the Python-repr call lists of the smolagents format; never evaluated beyond literals)."""
    out, i = [], 0
    while i < len(text):
        if text[i] in "{[":
            end = bracket_end(text, i)
            if end is not None:
                try:
                    out.append((i, end, ast.literal_eval(text[i:end])))
                    i = end
                    continue
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    pass
        i += 1
    return out


def _as_call(obj, known: set[str] | None) -> ParsedCall | None:
    if not isinstance(obj, dict):
        return None
    if "function" in obj and isinstance(obj["function"], dict):
        obj = obj["function"]
    name = obj.get("name") or obj.get("tool") or obj.get("tool_name") or obj.get("action")
    if not isinstance(name, str) or (known and name not in known):
        return None
    args = obj.get("arguments", obj.get("parameters", obj.get("args", obj.get("action_input", {}))))
    return ParsedCall(name, call_arguments({"name": name, "arguments": args}, on_error="input", dict_only=True))


def _calls_from(obj, known) -> list[ParsedCall]:
    items = obj if isinstance(obj, list) else [obj]
    return [c for c in (_as_call(x, known) for x in items) if c is not None]


def parse_tool_calls(text: str, known_tools: list[str] | None = None) -> tuple[str, list[ParsedCall]]:
    """Return (text before the first call, calls). ``known_tools`` restricts names (recommended)."""
    known = set(known_tools) if known_tools else None
    for pattern in (_TAGGED, _FENCED):
        calls, first = [], None
        for m in pattern.finditer(text):
            for _, _, obj in _json_objects(m.group(1)):
                found = _calls_from(obj, known)
                if found and first is None:
                    first = m.start()
                calls += found
        if calls:
            return text[:first].strip(), calls
    for literals in (_json_objects, _python_literals):
        for start, _end, obj in literals(text):
            found = _calls_from(obj, known)
            if found:
                head = text[:start]
                head = re.sub(r"(Calling tools:|Action:)\s*$", "", head.rstrip())
                return head.strip(), found
    if known:
        for m in _PYCALL.finditer(text):
            name = m.group(1)
            if name not in known:
                continue
            args = _py_args(m.group(2))
            if args is not None:
                return text[:m.start()].strip(), [ParsedCall(name, args)]
    return text.strip(), []


def _py_args(src: str) -> dict | None:
    try:
        node = ast.parse(f"f({src})", mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Call):
        return None
    try:
        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
        if node.args:
            args.setdefault("input", ast.literal_eval(node.args[0]))
    except (ValueError, SyntaxError):
        return None
    return args


# ------------------------------------------------------------------ tag-format agents (Search-R1 / IRCoT)
_TAG = {name: re.compile(rf"<{name}>(.*?)</{name}>", re.S) for name in ("think", "search", "answer", "information")}


@dataclass
class TagAction:
    """One reply of a tag-format agent (seed 004 §2, "Following Jin et al. (2025), LLMs are instructed to
    encapsulate their search queries, retrieved documents, and final answer between specially designated
    tokens"): the thoughts (``<think>``), the queries (``<search>``), the answer (``<answer>``, None when
    absent) and ``text``: the reply cut after the first closed ``</search>`` or ``</answer>``, which is
    what a tag agent keeps in its context (Search-R1 stops generating there)."""

    thoughts: list[str] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)
    answer: str | None = None
    text: str = ""


def parse_tags(text: str) -> TagAction:
    """Parse ``<think>``, ``<search>`` and ``<answer>`` spans out of a tag-format reply. Only closed spans
    count, as in Search-R1 (``<(search|answer)>(.*?)</\\1>``): a reply cut off inside ``<search>`` is no
    query. Only what comes before the first ``</search>`` or ``</answer>`` counts (text a model writes after
    it, e.g. an invented ``<information>`` block, is dropped). Empty spans are ignored."""
    ends = [m.end() for m in (re.search(r"</search>", text), re.search(r"</answer>", text)) if m]
    cut = text[: min(ends)] if ends else text
    spans = {name: [s.strip() for s in pat.findall(cut) if s.strip()] for name, pat in _TAG.items()}
    answers = spans["answer"]
    return TagAction(thoughts=spans["think"], queries=spans["search"], answer=answers[0] if answers else None,
                     text=cut.strip())
