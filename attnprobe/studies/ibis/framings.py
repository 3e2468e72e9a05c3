"""The three IBIS framings of one item, as trajectories (DESIGN section 8, paper appendix E).

All three share, character for character, the system prompt, the tool list, the task text, the
results block and the reminder; they differ only in who *owns* the search:

``agentic``  the model's own action history: the user gives the task, an assistant message of the
             model calls ``web_search(query)``, the results come back as that call's observation
             (a ``tool`` message) and a user message carries the reminder.
``observer`` no assistant turn: one user message holds the task, the query and the results as
             neutral external reference, then the reminder (the paper's Observer Mode; we also
             show the query, quoted, so its attention can be compared with the own call).
``direct``   the context-isolated filter (NIS-Agent): one compact user message with the task, "your
             current search query" and its candidate results, then the reminder; no history.

Segment labels. Every piece we measure is marked with an ``annotations`` span, so capture gives it
its own segment; :func:`segment_categories` maps segments to the categories below.

==========  ===========================================================================
query       agentic: the model's own tool call (role ``tool_call``, author ``self``);
            observer/direct: the quoted query text (role ``tool_call``, author ``external``,
            i.e. "a search call shown as external text")
results     the results block (role ``observation``, author ``external``) in every framing
reminder    the ``<system-reminder>`` text (role ``task``, author ``external``)
task        the task text after ``Task:``, with its leading space so that the span starts on a token
            boundary (role ``task``, author ``external``)
system      the system prompt
framing     the remaining user-side wrapper words ("Task:", "Here are some search results ...")
template    chat-template markers, special tokens, the generation prompt and any text the
            renderer inserts (e.g. ``Calling tools:``/``Call id:`` in the text fallback)
==========  ===========================================================================
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from attnprobe.studies.ibis.items import IbisItem, results_text
from attnprobe.trajectory.schema import Trajectory

FRAMINGS = ("agentic", "observer", "direct")
CATEGORIES = ("query", "results", "reminder", "task", "system", "framing", "template")
INVARIANT_CATEGORIES = ("system", "results", "reminder", "task")
CALL_ID = "call_1"

SYSTEM_PROMPT = (
    "You are a web research agent working on a task step by step. You have two tools:\n"
    "- web_search(query): run a new web search and get a list of results (title, URL, snippet).\n"
    "- visit_page(url): open one result page and read its full text.\n"
    "Answer with exactly one tool call in JSON, for example "
    '{"name": "visit_page", "arguments": {"url": "https://example.org/page"}} or '
    '{"name": "web_search", "arguments": {"query": "a better query"}}.'
)

REMINDER = (
    "<system-reminder>You should first consider whether these webpages are helpful for completing the task "
    "based on the summaries. If they are not helpful, you need to search again with a different query. "
    "Your response should always be a tool call.</system-reminder>"
)

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "web_search",
        "description": "Run a web search and return the top results (title, URL and snippet).",
        "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "The query."}},
                       "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "visit_page",
        "description": "Open a web page and return its readable text.",
        "parameters": {"type": "object", "properties": {"url": {"type": "string", "description": "Absolute URL."}},
                       "required": ["url"]}}},
]
TOOL_NAMES = ("web_search", "visit_page")


class _Builder:
    """Builds one user message's text while recording annotation spans."""

    def __init__(self):
        self.text = ""
        self.annotations: list[dict] = []
        self.names: list[str] = []

    def add(self, text: str, category: str | None = None, role: str = "task", author: str = "external"):
        if category is not None:
            self.annotations.append({"start": len(self.text), "end": len(self.text) + len(text), "role": role,
                                     "author": author})
            self.names.append(category)
        self.text += text
        return self

    def message(self, index: int, spans: list[dict]) -> dict:
        for j, cat in enumerate(self.names):
            spans.append({"category": cat, "message_index": index, "part": f"annotation[{j}]"})
        return {"role": "user", "content": self.text, "annotations": self.annotations}


def build_framing(item: IbisItem, framing: str) -> Trajectory:
    """The item rendered as a trajectory under one framing (see module docstring)."""
    if framing not in FRAMINGS:
        raise ValueError(f"framing must be one of {', '.join(FRAMINGS)}; got {framing!r}")
    res = results_text(item)
    spans: list[dict] = []
    messages: list[dict] = [{"role": "system", "content": SYSTEM_PROMPT}]
    if framing == "agentic":
        messages.append(_Builder().add("Task:").add(" " + item.task, "task").message(1, spans))
        messages.append({"role": "assistant", "content": "", "tool_calls": [{
            "id": CALL_ID, "type": "function",
            "function": {"name": "web_search", "arguments": json.dumps({"query": item.query}, ensure_ascii=False)}}]})
        # A tool message is an observation (author external) as a whole: no annotation needed.
        messages.append({"role": "tool", "tool_call_id": CALL_ID, "content": res})
        spans.append({"category": "results", "message_index": 3, "part": "content"})
        messages.append(_Builder().add(REMINDER, "reminder").message(4, spans))
    else:
        b = _Builder().add("Task:").add(" " + item.task, "task")
        if framing == "observer":
            b.add("\n\nHere are some search results that may help you with this task.\nSearch query: \"")
        else:
            b.add("\n\nYour current search query: \"")
        b.add(item.query, "query", role="tool_call")
        b.add("\"\nResults:\n" if framing == "observer" else "\"\nIts candidate results:\n")
        b.add(res, "results", role="observation").add("\n\n").add(REMINDER, "reminder")
        messages.append(b.message(1, spans))
    return Trajectory(
        id=f"{item.id}/{framing}", messages=messages, task=item.task, framing=framing,
        tools=[dict(t) for t in TOOLS], labels={"ibis": item.label, "expected_action": item.expected_action},
        meta={"ibis": {"item_id": item.id, "framing": framing, "label": item.label, "domain": item.domain,
                       "query": item.query, "spans": spans}},
    )


def segment_categories(segments: Sequence, trajectory: Trajectory) -> list[str]:
    """The IBIS category of every segment of a rendered/captured framing trajectory."""
    spans = {(s["message_index"], s["part"]): s["category"] for s in trajectory.meta["ibis"]["spans"]}
    out = []
    for seg in segments:
        cat = spans.get((seg.message_index, seg.part))
        if cat is None:
            if seg.role == "system":
                cat = "system"
            elif seg.role == "template":
                cat = "template"
            elif seg.role == "tool_call" and seg.author == "self":
                cat = "query"
            else:
                cat = "framing"
        out.append(cat)
    return out


def category_tokens(rendered, trajectory: Trajectory) -> dict[str, list[int]]:
    """Token ids of every category, concatenated in order (for the invariant checks)."""
    cats = segment_categories(rendered.segments, trajectory)
    out: dict[str, list[int]] = {c: [] for c in CATEGORIES}
    ids = np.asarray(rendered.input_ids)
    for seg, cat in zip(rendered.segments, cats):
        out[cat] += ids[seg.start:seg.end].tolist()
    return out


def check_invariants(tokenizer, item: IbisItem, framings: Sequence[str] = FRAMINGS) -> dict[str, Any]:
    """Render every framing and compare the token ids of system prompt, task, results and reminder.

    Returns {"ok": bool, "rendering": {framing: mode}, "problems": [..], "tokens": {framing: {cat: n}}}.
    """
    from attnprobe.render.rendering import render

    toks, modes, problems = {}, {}, []
    for fr in framings:
        traj = build_framing(item, fr)
        rendered = render(traj, tokenizer, add_generation_prompt=True)
        modes[fr] = rendered.rendering
        toks[fr] = category_tokens(rendered, traj)
        if rendered.segments[-1].role != "template" or rendered.decision.position != len(rendered.input_ids) - 1:
            problems.append(f"{fr}: the decision position is not the last prompt token of the generation prompt")
        for cat in ("query",) + INVARIANT_CATEGORIES:
            if not toks[fr][cat]:
                problems.append(f"{fr}: no tokens labelled {cat!r}")
    ref = framings[0]
    for fr in framings[1:]:
        for cat in INVARIANT_CATEGORIES:
            if toks[fr][cat] != toks[ref][cat]:
                problems.append(f"{cat} tokens differ between {ref} ({len(toks[ref][cat])} tokens) and {fr} "
                                f"({len(toks[fr][cat])} tokens)")
    return {"ok": not problems, "rendering": modes, "problems": problems,
            "tokens": {fr: {c: len(v) for c, v in t.items()} for fr, t in toks.items()}}
