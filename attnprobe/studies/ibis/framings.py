"""The three IBIS framings of one item, as trajectories (DESIGN section 8, paper appendix E).

Two protocols (docs/methods.md):

``paper`` (default) seed 001 appendix E character for character: observer = one user message
           ``Task: {task}`` + ``Here are some search results that may help you with this task:`` and
           the fenced results + the reminder ending "search with a different query" (the query is never
           shown); agentic = user ``Task: {task}``, an assistant text ``Calling tools:`` with the
           Python-repr call, then one user message ``Call id: ...\nObservation:`` with the fenced results
           + the reminder ending "adjust the query and search again". The paper's three text parts of a
           user message are joined with a newline (chat templates take one string). Direct mode is the
           NIS-Agent context-isolated filter prompt, the same one the runner uses.
``matched`` the layout below, where the observer and direct framings also show the query, so that
           attention to the *same query tokens* can be compared between own and external.

The ``matched`` layout:

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
call        paper protocol, agentic: the own ``Calling tools:`` call text around the query (role
            ``tool_call``, author ``self``); the query inside it is ``query``
==========  ===========================================================================
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnprobe.studies.ibis.items import IbisItem, results_text
from attnprobe.trajectory.schema import Trajectory

FRAMINGS = ("agentic", "observer", "direct")
PROTOCOLS = ("paper", "matched")
CATEGORIES = ("query", "results", "reminder", "task", "system", "framing", "template", "call")
# matched: the query tokens too are identical across framings (that is what makes the own-vs-external
# query gap length-matched: the same tokens, only their owner differs)
INVARIANT_CATEGORIES = ("system", "results", "reminder", "task", "query")
CALL_ID = "call_1"

SYSTEM_PROMPT = (
    "You are a web research agent working on a task step by step. You have two tools:\n"
    "- web_search(query): run a new web search and get a list of results (title, URL, snippet).\n"
    "- visit_page(url): open one result page and read its full text.\n"
    "Answer with exactly one tool call in JSON, for example "
    '{"name": "visit_page", "arguments": {"url": "https://example.org/page"}} or '
    '{"name": "web_search", "arguments": {"query": "a better query"}}.'
)

# The matched protocol's one reminder (ours: the observer listing below with "again" inserted; kept as it
# was so that matched runs stay comparable with the earlier ones; identical in all three framings).
REMINDER = (
    "<system-reminder>You should first consider whether these webpages are helpful for completing the task "
    "based on the summaries. If they are not helpful, you need to search again with a different query. "
    "Your response should always be a tool call.</system-reminder>"
)

# Seed 001 appendix E, verbatim: the two listings (observer and agentic). The appendix prose says "an
# identical <system-reminder> is appended in both modes", but its two listings differ in the last
# instruction. ``reminder="listing"`` (the paper protocol's default) follows the listings;
# ``reminder="identical"`` follows the prose and appends the observer listing's text in both modes (it
# names no query, which the paper's observer never sees). tests/unit/test_ibis_framings.py compares
# both with the text of ../shared/seeds/001_*.txt.
REMINDER_OBSERVER_PAPER = (
    "<system-reminder>You should first consider whether these webpages are helpful for completing the task "
    "based on the summaries. If they are not helpful, you need to search with a different query. "
    "Your response should always be a tool call.</system-reminder>"
)
REMINDER_AGENTIC_PAPER = (
    "<system-reminder>You should first consider whether these webpages are helpful for completing the task "
    "based on the summaries. If they are not helpful, you need to adjust the query and search again. "
    "Your response should always be a tool call.</system-reminder>"
)
REMINDER_IDENTICAL_PAPER = REMINDER_OBSERVER_PAPER
REMINDERS = ("listing", "identical")
PAPER_PART_SEPARATOR = "\n"  # between the text parts of one user message (see the module docstring)
FENCE = "```"

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

    def message(self, index: int, spans: list[dict], role: str = "user") -> dict:
        for j, cat in enumerate(self.names):
            spans.append({"category": cat, "message_index": index, "part": f"annotation[{j}]"})
        return {"role": role, "content": self.text, "annotations": self.annotations}


def paper_call_text(query: str, call_id: str = CALL_ID, tool: str = "web_search") -> tuple[str, int, int]:
    """The agentic assistant text of appendix E and the character span of the query inside it."""
    head = (f"Calling tools:\n[{{'id': '{call_id}', 'type': 'function', 'function': {{'name': '{tool}', "
            f"'arguments': {{'query': '")
    return head + query + "'}}}]", len(head), len(head) + len(query)


def resolve_reminder(protocol: str, reminder: str | None) -> str:
    """The reminder choice of a run: ``listing`` (each mode's own listing, the paper protocol's default)
    or ``identical`` (one reminder in both modes; the matched protocol has nothing else)."""
    if reminder is None:
        return "listing" if protocol == "paper" else "identical"
    if reminder not in REMINDERS:
        raise ValueError(f"reminder must be one of {', '.join(REMINDERS)}; got {reminder!r}")
    if protocol != "paper" and reminder != "identical":
        raise ValueError(f"reminder {reminder!r} applies to the paper protocol only (the {protocol} protocol appends "
                         "one identical reminder in every framing)")
    return reminder


@dataclass(frozen=True)
class IbisProtocol:
    """How a run frames its items: ``name`` (:data:`PROTOCOLS`: ``paper``, seed 001's appendix E text;
    ``matched``, ours) and its ``reminder`` choice, resolved on construction (:func:`resolve_reminder`: None
    takes the protocol's default, ``listing`` for paper, ``identical`` for matched). One value travels from
    the options to every stage, job, framing and report (never the two strings apart); records keep the two
    keys ``protocol`` and ``reminder`` they always had."""

    name: str = "paper"
    reminder: str | None = None

    def __post_init__(self):
        if self.name not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}; got {self.name!r}")
        object.__setattr__(self, "reminder", resolve_reminder(self.name, self.reminder))

    def record(self) -> dict[str, str]:
        """The two keys a record holds (``run.json``, decisions, captures' meta)."""
        return {"protocol": self.name, "reminder": self.reminder}


def as_protocol(protocol: IbisProtocol | str) -> IbisProtocol:
    """``protocol`` as a value; a name (``"paper"``, ``"matched"``) takes that protocol's default reminder."""
    return protocol if isinstance(protocol, IbisProtocol) else IbisProtocol(protocol)


def paper_reminder(framing: str, reminder: str = "listing") -> str:
    """The reminder text the paper protocol appends in ``framing`` (see :data:`REMINDER_OBSERVER_PAPER`)."""
    if reminder == "identical":
        return REMINDER_IDENTICAL_PAPER
    return REMINDER_AGENTIC_PAPER if framing == "agentic" else REMINDER_OBSERVER_PAPER


def _paper_messages(item: IbisItem, framing: str, res: str, spans: list[dict], own_tool: str,
                    reminder: str = "listing") -> list[dict]:
    sep = PAPER_PART_SEPARATOR
    messages: list[dict] = [{"role": "system", "content": SYSTEM_PROMPT}]
    if framing == "observer":
        b = _Builder().add("Task:").add(" " + item.task, "task").add(sep)
        b.add(f"Here are some search results that may help you with this task:\n{FENCE}\n")
        b.add(res, "results", role="observation").add(f"\n{FENCE}").add(sep).add(paper_reminder("observer", reminder),
                                                                          "reminder")
        messages.append(b.message(1, spans))
        return messages
    # agentic
    messages.append(_Builder().add("Task:").add(" " + item.task, "task").message(1, spans))
    text, qs, qe = paper_call_text(item.query, tool=own_tool)
    call = _Builder().add(text[:qs], "call", role="tool_call", author="self")
    call.add(text[qs:qe], "query", role="tool_call", author="self").add(text[qe:], "call", role="tool_call",
                                                                          author="self")
    msg = call.message(2, spans, role="assistant")
    messages.append(msg)
    b = _Builder().add(f"Call id: {CALL_ID}\nObservation:\n{FENCE}\n").add(res, "results", role="observation")
    b.add(f"\n{FENCE}").add(sep).add(paper_reminder("agentic", reminder), "reminder")
    messages.append(b.message(3, spans))
    return messages


def _located(text: str, pieces: list[tuple[str, str, str, str]]) -> list[dict]:
    """Annotations for (substring, category, role, author) found in order in ``text``."""
    anns, cursor = [], 0
    for sub, _cat, role, author in pieces:
        pos = text.index(sub, cursor)
        anns.append({"start": pos, "end": pos + len(sub), "role": role, "author": author})
        cursor = pos + len(sub)
    return anns


def _paper_direct(item: IbisItem, res: str, spans: list[dict]) -> tuple[list[dict], list[dict]]:
    """Direct mode = the runner's context-isolated filter prompt, text for text and, like the runner's
    filter call, without tools (one prompt for both): answered "No" (+ a query) or with 1-2 sites."""
    from attnprobe.agents.filter import REMINDER_ISOLATED, isolated_messages

    messages = isolated_messages(item.task, item.query, res)
    user = dict(messages[1])
    pieces = [(" " + item.task, "task", "task", "external"), (" " + item.query, "query", "tool_call", "external"),
              (res, "results", "observation", "external"), (REMINDER_ISOLATED, "reminder", "task", "external")]
    user["annotations"] = _located(user["content"], pieces)
    for j, (_, cat, _, _) in enumerate(pieces):
        spans.append({"category": cat, "message_index": 1, "part": f"annotation[{j}]"})
    return [dict(messages[0]), user], []


COPY_CONTROL_TOOL = "google_search"  # the own call's tool name in the forced-choice copy control


FILLER_UNIT = " ."  # the position control's neutral filler: one token per unit in BPE vocabularies (checked)


def build_framing(item: IbisItem, framing: str, protocol: IbisProtocol | str = "paper", *,
                  own_tool: str = "web_search", pad: int = 0) -> Trajectory:
    """The item rendered as a trajectory under one framing and protocol (see module docstring; a protocol
    name takes its default reminder, :func:`as_protocol`).

    The protocol's ``reminder`` (paper protocol): ``"listing"`` (default) appends each mode's own appendix-E
    listing, ``"identical"`` the observer listing's text in both modes, as the appendix prose says
    (:func:`resolve_reminder`; recorded in ``meta.ibis.reminder``). The direct framing keeps the
    filter prompt's own reminder either way.

    ``own_tool`` renames the tool of the agentic framing's own earlier call (the copy control of the
    forced choice: with :data:`COPY_CONTROL_TOOL` the context no longer holds the option's name in
    the call the model made itself; docs/methods.md).

    ``pad`` (matched observer only): ``pad`` copies of :data:`FILLER_UNIT` after the quoted query, before
    ``Results:``; they move the query away from the decision token without changing any labelled text
    (the position control, :func:`attnprobe.studies.ibis.position.shifted_observer`)."""
    if framing not in FRAMINGS:
        raise ValueError(f"framing must be one of {', '.join(FRAMINGS)}; got {framing!r}")
    protocol, reminder = (p := as_protocol(protocol)).name, p.reminder  # the value, read once
    if pad and (protocol != "matched" or framing != "observer"):
        raise ValueError("pad applies to the matched observer framing only (the paper's observer shows no query)")
    if pad < 0:
        raise ValueError(f"pad must be >= 0; got {pad}")
    res = results_text(item)
    spans: list[dict] = []
    messages: list[dict] = [{"role": "system", "content": SYSTEM_PROMPT}]
    tools = [dict(t) for t in TOOLS]
    if protocol == "paper" and framing == "direct":
        messages, tools = _paper_direct(item, res, spans)
    elif protocol == "paper":
        messages = _paper_messages(item, framing, res, spans, own_tool, reminder)
    elif framing == "agentic":
        messages.append(_Builder().add("Task:").add(" " + item.task, "task").message(1, spans))
        # the query argument is its own segment (category query); the rest of the call is category call
        messages.append({"role": "assistant", "content": "", "tool_calls": [{
            "id": CALL_ID, "type": "function",
            "function": {"name": own_tool, "arguments": json.dumps({"query": item.query}, ensure_ascii=False)},
            "annotations": [{"argument": "query", "role": "tool_call", "author": "self"}]}]})
        spans.append({"category": "query", "message_index": 2, "part": "tool_calls[0].arguments.query"})
        spans.append({"category": "call", "message_index": 2, "part": "tool_calls[0]"})
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
        b.add("\"" + FILLER_UNIT * pad + "\nResults:\n" if framing == "observer" else "\"\nIts candidate results:\n")
        b.add(res, "results", role="observation").add("\n\n").add(REMINDER, "reminder")
        messages.append(b.message(1, spans))
    return Trajectory(
        id=f"{item.id}/{framing}", messages=messages, task=item.task, framing=framing,
        tools=tools, labels={"ibis": item.label, "expected_action": item.expected_action},
        meta={"ibis": {"item_id": item.id, "framing": framing, "label": item.label, "domain": item.domain,
                       "query": item.query, "spans": spans, "protocol": protocol,
                       "reminder": reminder, **({"pad": pad} if pad else {}),
                       **({"own_tool": own_tool} if own_tool != "web_search" else {})}},
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
                cat = "call"
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


def invariant_categories(protocol: IbisProtocol, a: str, b: str) -> tuple[str, ...]:
    """The categories whose tokens must be identical between framings ``a`` and ``b``.

    matched: system, results, reminder and task everywhere. paper: the results and the task
    everywhere; the system prompt between agentic and observer (direct is the filter's own prompt);
    the reminders differ by design with ``reminder="listing"`` (appendix E's two listings), so they are
    compared only with ``reminder="identical"``.
    """
    if protocol.name == "matched":
        return INVARIANT_CATEGORIES
    if "direct" in {a, b}:
        return ("results", "task")
    same = ("reminder",) if protocol.reminder == "identical" else ()
    return ("system", "results", "task") + same


def check_invariants(tokenizer, item: IbisItem, framings: Sequence[str] = FRAMINGS,
                     protocol: IbisProtocol | str = "paper") -> dict[str, Any]:
    """Render every framing and compare the token ids of what must be identical (per protocol).

    Returns {"ok": bool, "protocol", "reminder", "rendering": {framing: mode}, "problems": [..],
    "tokens": {framing: {cat: n}}}.
    """
    from attnprobe.render.rendering import render

    protocol = as_protocol(protocol)
    toks, modes, problems = {}, {}, []
    for fr in framings:
        traj = build_framing(item, fr, protocol)
        rendered = render(traj, tokenizer, add_generation_prompt=True)
        modes[fr] = rendered.rendering
        toks[fr] = category_tokens(rendered, traj)
        if rendered.segments[-1].role != "template" or rendered.decision.position != len(rendered.input_ids) - 1:
            problems.append(f"{fr}: the decision position is not the last prompt token of the generation prompt")
        needed = ("results", "reminder", "task", "system")
        if protocol.name == "matched" or fr != "observer":
            needed = ("query",) + needed  # the paper's observer never shows the query
        for cat in needed:
            if not toks[fr][cat]:
                problems.append(f"{fr}: no tokens labelled {cat!r}")
    for i, ref in enumerate(framings):
        for fr in framings[i + 1:]:
            for cat in invariant_categories(protocol, ref, fr):
                if toks[fr][cat] != toks[ref][cat]:
                    problems.append(f"{cat} tokens differ between {ref} ({len(toks[ref][cat])} tokens) and {fr} "
                                    f"({len(toks[fr][cat])} tokens)")
    return {"ok": not problems, **protocol.record(),
            "rendering": modes, "problems": problems,
            "tokens": {fr: {c: len(v) for c, v in t.items()} for fr, t in toks.items()}}
