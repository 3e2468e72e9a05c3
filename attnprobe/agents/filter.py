"""The search-result filter after each web_search (seed 000, section 4.1, appendix B.1 and Figure 8).

- ``isolated`` (NIS-Agent, the IBIS *direct* mode): a fresh context holding only the task, the query
  and the results. The filter answers in plain text: ``No`` (none of the results is helpful;
  optionally ``Query: <better query>`` on the next line) or the URLs of the one or two most helpful
  results, one per line.
- ``in-context``: the same judgement and answer format asked inside the worker's full history (the
  IBIS *agentic* framing), the variant the paper shows to be vulnerable to inertia bias.
- ``none``: results go straight to the worker.

:func:`parse_filter_reply` turns a reply into a :class:`FilterDecision` (tool-call replies are
accepted too: ``visit_page(url)`` = that site, ``web_search(query)`` = No plus the rewrite), and
:func:`filter_action` maps it to the tool a worker would call next (No -> web_search, sites ->
visit_page). What the runner's worker then sees is decided by the runner (``studies/runner/worker.py``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from attnprobe.agents.tools import FILTER_TOOLS, arg, call_args  # noqa: F401  (FILTER_TOOLS: IBIS)
from attnprobe.generation.toolparse import parse_tool_calls

# Ours (taken from the reference code, PangSMPang/NIS-Agent, which is not in the seeds): the filter keeps
# at most the two most helpful sites.
MAX_SITES = 2

FILTER_SYSTEM = (
    "You screen web search results for a research task. You see only the task, the search query and the "
    "results (title, URL and summary of each page). Judge from the summaries whether a page is likely to help "
    "with the task.\n"
    "Answer in plain text and nothing else:\n"
    "- if none of the results is helpful, write No and, on the next line, a different search query:\n"
    "No\nQuery: <a different search query>\n"
    "- otherwise write the URL of the most helpful result, or the URLs of the two most helpful results, one per "
    "line:\nhttps://...\n"
)

REMINDER_ISOLATED = ("<system-reminder>You should first consider whether these webpages are helpful for completing "
                     "the task based on the summaries. If they are not helpful, you need to search with a different "
                     "query: answer No and, on the next line, Query: followed by the new query. Otherwise answer "
                     "with the URL of the most helpful webpage, or the URLs of the two most helpful, one per "
                     "line.</system-reminder>")
REMINDER_IN_CONTEXT = ("<system-reminder>You should first consider whether these webpages are helpful for completing "
                       "the task based on the summaries. If they are not helpful, you need to adjust the query and "
                       "search again: answer No and, on the next line, Query: followed by the new query. Otherwise "
                       "answer with the URL of the most helpful webpage, or the URLs of the two most helpful, one "
                       "per line. Answer in plain text, not with a tool call.</system-reminder>")
# Sent after a bare "No" (or a No whose query repeats the old one) to get the rewrite.
ASK_QUERY = "None of these results is helpful. Write one different search query for the task, on one line, nothing else."


def isolated_messages(task: str, query: str, results_text: str) -> list[dict]:
    """The compact, isolated context: task, query and results only (nothing of the worker's history)."""
    return [
        {"role": "system", "content": FILTER_SYSTEM},
        {"role": "user", "content": f"Task: {task}\n\nSearch query: {query}\n\nSearch results:\n```\n{results_text}\n"
                                    f"```\n\n{REMINDER_ISOLATED}"},
    ]


def in_context_messages(worker_history: list[dict]) -> list[dict]:
    """The worker's own history (ending with the web_search observation) plus the reminder."""
    return list(worker_history) + [{"role": "user", "content": REMINDER_IN_CONTEXT}]


def ask_query_messages(messages: list[dict], reply_text: str) -> list[dict]:
    """The same filter context, its No reply, and the request for a rewritten query."""
    return list(messages) + [{"role": "assistant", "content": reply_text or "No"},
                             {"role": "user", "content": ASK_QUERY}]


@dataclass
class FilterDecision:
    """``relevant`` False = No (search again); ``chosen_urls`` are always URLs of the given results.
    ``parsed`` False = no decision could be read (the runner fails open: results kept)."""

    relevant: bool
    chosen_urls: list[str] = field(default_factory=list)
    new_query: str | None = None
    parsed: bool = True
    method: str = ""

    @property
    def kind(self) -> str:
        """no | sites | keep (relevant, no site named) | unparseable."""
        if not self.parsed:
            return "unparseable"
        if not self.relevant:
            return "no"
        return "sites" if self.chosen_urls else "keep"

    def to_dict(self) -> dict:
        return {**asdict(self), "kind": self.kind}


def filter_action(decision: FilterDecision) -> str:
    """The worker action a decision stands for: No -> "web_search", sites -> "visit_page"."""
    if not decision.parsed:
        return "unparseable"
    return "visit_page" if decision.relevant else "web_search"


def _field(r: Any, key: str) -> str:
    v = r.get(key) if isinstance(r, Mapping) else getattr(r, key, "")
    return str(v or "")


def _norm_url(u: str) -> str:
    u = u.strip().strip("<>()[]{}\"'`*").rstrip(".,;:!?").rstrip("/")
    return re.sub(r"^https?://(www\.)?", "", u, flags=re.I).lower()


def _norm_text(s: str) -> str:
    return " ".join(re.findall(r"\w+", s.lower()))


_URL = re.compile(r"https?://[^\s<>\"'`\]\)]+|www\.[^\s<>\"'`\]\)]+", re.I)
_INDEX = re.compile(r"^(?:results?|sites?|pages?|number|#)?\s*\[?#?(\d{1,2})\]?\s*(?:[.):\-]|$)", re.I)
_NO = re.compile(r"^(?:no|none|nope|not (?:helpful|relevant)|irrelevant)\b", re.I)
_YES = re.compile(r"^(?:yes|helpful|relevant)\b", re.I)
_QUERY = re.compile(r"^(?:new |better |different |rewritten |adjusted |search )?query\s*[:=]\s*(.+)$", re.I)
_PREFIX = re.compile(r"^(?:(?:the|my|final)\s+)?(?:answer|decision|reply|response|output)(?:\s+is)?\s*[:=]\s*",
                     re.I)
_QUOTED = re.compile(r"[\"“”']([^\"“”']{3,})[\"“”']")


def _clean_line(line: str) -> str:
    line = line.strip().strip("*_#>` ").strip()
    line = re.sub(r"^[-•]\s+", "", line)
    return _PREFIX.sub("", line).strip()


def clean_query(q: str) -> str:
    q = _clean_line(q)
    m = _QUERY.match(q)
    if m:
        q = m.group(1)
    return q.strip().strip("\"'`“”").strip()


def _match_url(u: str, results: Sequence) -> str | None:
    n = _norm_url(u)
    for r in results:
        if n and _norm_url(_field(r, "url")) == n:
            return _field(r, "url")
    return None


def _from_call(name: str, args: dict, results: Sequence) -> FilterDecision:
    if name == "web_search":
        q = arg(args, "query")
        return FilterDecision(relevant=False, new_query=q or None, method="tool_call")
    urls = []
    for v in [arg(args, "url"), *(str(x) for x in args.values() if isinstance(x, (str, int)))]:
        hit = _match_url(v, results) or _index_hit(str(v), results)
        if hit and hit not in urls:
            urls.append(hit)
    if not urls:
        return FilterDecision(relevant=True, parsed=False, method="tool_call_unknown_url")
    return FilterDecision(relevant=True, chosen_urls=urls[:MAX_SITES], method="tool_call")


def _index_hit(s: str, results: Sequence) -> str | None:
    m = _INDEX.match(s.strip())
    if m and 1 <= int(m.group(1)) <= len(results):
        return _field(results[int(m.group(1)) - 1], "url")
    return None


def parse_filter_reply(text: str, results: Sequence) -> FilterDecision:
    """Read a filter reply against the results it judged (dicts or objects with title/url/snippet).

    Accepted: ``No`` (first line; ``None``/``Not helpful`` too) optionally followed by a query
    (``Query: ...`` or the next line); result URLs (matched without scheme/www/trailing slash),
    result numbers (``2``, ``[2]``, ``Result 2``) or exact titles (a whole line, or quoted), at most
    two, in the order written; a leading ``Answer:`` / ``The answer is:`` is ignored;
    a ``web_search``/``visit_page`` tool call in any syntax :mod:`~attnprobe.generation.toolparse` reads.
    ``Yes`` without a site is relevant with no choice (kind "keep"). Anything else, or only URLs
    that are not among the results, is unparseable.
    """
    text = (text or "").strip()
    if not text:
        return FilterDecision(relevant=True, parsed=False, method="empty")
    _, calls = parse_tool_calls(text, ["web_search", "visit_page"])
    if calls:
        return _from_call(calls[0].name, calls[0].arguments, results)
    lines = [ln for ln in (_clean_line(x) for x in text.splitlines()) if ln]
    if not lines:
        return FilterDecision(relevant=True, parsed=False, method="empty")
    first = lines[0]
    if _NO.match(first):
        query = None
        for i, ln in enumerate(lines):
            m = _QUERY.match(ln)
            rest = re.sub(r"^(?:no|none|nope)\b[\s,.:;!\-]*", "", ln, flags=re.I) if i == 0 else ln
            if m:
                query = clean_query(m.group(1))
            elif i == 1 and not _URL.search(ln):
                query = clean_query(ln)
            elif i == 0 and rest and re.match(r"(?:try|search(?: for)?|use)\b", rest, re.I):
                query = clean_query(re.sub(r"^(?:try|search(?: for)?|use)\b\s*:?\s*", "", rest, flags=re.I))
            if query:
                break
        return FilterDecision(relevant=False, new_query=query or None, method="no+query" if query else "no")
    chosen: list[str] = []
    methods: list[str] = []
    titles = {_norm_text(_field(r, "title")): _field(r, "url") for r in results if _norm_text(_field(r, "title"))}
    saw_url = False
    for ln in lines:
        found = []
        for u in _URL.findall(ln):
            saw_url = True
            hit = _match_url(u, results)
            if hit:
                found.append((hit, "url"))
        if not found:
            hit = _index_hit(ln, results)
            if hit:
                found.append((hit, "index"))
            else:
                for t in [ln, *_QUOTED.findall(ln)]:  # a line that is a title, or a quoted title in a sentence
                    if _norm_text(t) in titles:
                        found.append((titles[_norm_text(t)], "title"))
                        break
        for url, how in found:
            if url not in chosen:
                chosen.append(url)
                methods.append(how)
    if chosen:
        return FilterDecision(relevant=True, chosen_urls=chosen[:MAX_SITES], method="+".join(dict.fromkeys(methods)))
    if _YES.match(first):
        return FilterDecision(relevant=True, method="yes")
    return FilterDecision(relevant=True, parsed=False, method="unknown_url" if saw_url else "unparseable")


def decide(reply, results: Sequence) -> FilterDecision:
    """The decision in a :class:`~attnprobe.generation.chat.ChatReply`: a structured tool call first
    (servers that return ``tool_calls``), else the text."""
    if reply.tool_calls:
        call = reply.tool_calls[0]
        name = call["function"]["name"]
        if name in ("web_search", "visit_page"):
            return _from_call(name, call_args(call), results)
    return parse_filter_reply(reply.content or reply.raw_text, results)


def query_from_reply(reply) -> str | None:
    """The rewritten query in a reply to ASK_QUERY: a web_search call's query, a ``Query:`` line or
    the first line (None when that is empty, a bare No or longer than 200 characters)."""
    d = decide(reply, [])
    if d.new_query:
        return d.new_query
    text = (reply.content or reply.raw_text or "").strip()
    q = clean_query(next((ln for ln in text.splitlines() if ln.strip()), ""))
    return q if q and len(q) <= 200 and not re.fullmatch(r"(?:no|none|nope)\W*", q, re.I) else None


def same_query(a: str | None, b: str | None) -> bool:
    return _norm_text(a or "") == _norm_text(b or "")
