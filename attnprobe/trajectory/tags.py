"""Tag text (Search-R1 / IRCoT agents): which character spans of the agent's text are queries and documents.

Seed 004 §2: "LLMs are instructed to encapsulate their search queries, retrieved documents, and final answer
between specially designated tokens". The text stays as the agent saw it; these spans become ``annotations``
(:data:`attnprobe.trajectory.schema.ANNOTATION_ROLES`), so the renderer labels them without re-rendering:

- ``<search>q</search>``: role ``tool_call``, author ``self`` (the agent wrote its action);
- ``<information>d</information>``: role ``observation``, author ``external`` (the environment wrote it);
- everything else (``<think>`` text, ``<answer>``, prose) keeps the message's own label (assistant:
  ``reasoning``, author ``self``).

A span is its tag pair plus what lies between: the tags belong to the span they delimit, with its author
(the agent writes ``<search>``, the environment ``<information>``), as the template markers of a native tool
call belong to the call. Reading rules (one pass, linear time; docs/methods.md "Tag text"):

- ``<search>`` opens a query and the first ``</search>`` after it closes it, as Search-R1's
  ``<(search|answer)>(.*?)</\\1>`` reads it: a nested ``<search>`` is part of the query text. An empty query
  is still a span (the agent wrote it; the loop treats it as no query, so it starts no round). A ``<search>``
  never closed is prose (a reply cut off inside it: no query, as in Search-R1), unless an
  ``<information>`` block follows it, which is an error.
- ``<information>`` opens documents and only ``</information>`` closes them: tags inside retrieved text are
  the documents' text. A block must answer a query (a ``<search>`` before it with no block yet) and must
  close; otherwise :class:`TagError`.
- Stray closing tags are prose.
"""

from __future__ import annotations

from dataclasses import dataclass

SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"
SPAN_LABELS = {"search": ("tool_call", "self"), "information": ("observation", "external")}


class TagError(ValueError):
    """Malformed tag text; ``pos`` is the character offset the message names."""

    def __init__(self, message: str, pos: int):
        super().__init__(message)
        self.pos = pos


@dataclass(frozen=True)
class TagSpan:
    """``text[start:end]`` is ``<kind>...</kind>``, tags included."""

    kind: str  # "search" | "information"
    start: int
    end: int

    def inner(self, text: str) -> str:
        o, c = (SEARCH_OPEN, SEARCH_CLOSE) if self.kind == "search" else (INFO_OPEN, INFO_CLOSE)
        return text[self.start + len(o):self.end - len(c)]

    def annotation(self) -> dict:
        role, author = SPAN_LABELS[self.kind]
        return {"start": self.start, "end": self.end, "role": role, "author": author}


def scan(text: str, *, searches: bool = True, information: bool = True,
         pending: bool = False) -> tuple[list[TagSpan], bool]:
    """The ``<search>`` and ``<information>`` spans of ``text`` (in order) and whether a query is left
    unanswered at its end. ``searches``/``information``: which kinds to look for (a user message holds
    documents only); ``pending``: a query of an earlier message is still unanswered. Linear time: each
    tag is searched for from where the previous search of that tag ended, never from the start again."""
    spans: list[TagSpan] = []
    n = len(text)
    pos = 0
    next_s = text.find(SEARCH_OPEN) if searches else -1
    next_i = text.find(INFO_OPEN) if information else -1
    while True:
        if searches and 0 <= next_s < pos:
            next_s = text.find(SEARCH_OPEN, pos)
        if information and 0 <= next_i < pos:
            next_i = text.find(INFO_OPEN, pos)
        if next_s < 0 and next_i < 0:
            return spans, pending
        if next_s >= 0 and (next_i < 0 or next_s < next_i):
            s = next_s
            close = text.find(SEARCH_CLOSE, s + len(SEARCH_OPEN))
            if close < 0:
                if next_i > s:
                    raise TagError(f"unclosed <search> at character {s}, followed by the <information> block at "
                                   f"character {next_i}", s)
                return spans, pending  # a reply cut off inside <search>: prose, no query
            end = close + len(SEARCH_CLOSE)
            spans.append(TagSpan("search", s, end))
            pending, pos = True, end
            continue
        i = next_i
        if not pending:
            raise TagError(f"the <information> block at character {i} answers no <search> (documents follow the "
                           "query that retrieved them, one block per query)", i)
        close = text.find(INFO_CLOSE, i + len(INFO_OPEN))
        if close < 0:
            ans = text.find("<answer>", i)
            what = f", including the <answer> at character {ans}" if ans >= 0 else ""
            raise TagError(f"unclosed <information> at character {i}: it would swallow the rest of the text{what}", i)
        end = close + len(INFO_CLOSE)
        spans.append(TagSpan("information", i, end))
        pending, pos = False, min(end, n)


def closed(text: str, name: str) -> list[str]:
    """The text inside each closed ``<name>...</name>`` pair of ``text``, in order, as Search-R1's
    ``<name>(.*?)</name>`` (DOTALL) finds them: an open tag is closed by the first closing tag after it, and
    the next pair is searched for after that. Linear time (the lazy regex is quadratic on unclosed tags: a
    1 MB reply of ``<search>`` took minutes): once an open tag has no closing tag after it, none later can."""
    o, c = f"<{name}>", f"</{name}>"
    out, pos = [], 0
    while (start := text.find(o, pos)) >= 0:
        end = text.find(c, start + len(o))
        if end < 0:
            break
        out.append(text[start + len(o):end])
        pos = end + len(c)
    return out


def removed(text: str, name: str) -> str:
    """``text`` without its ``<name>...</name>`` pairs, an unclosed ``<name>`` taking the rest of the text with
    it: what ``re.sub(r"<name>.*?(?:</name>|$)", "", text, flags=re.S)`` gives (up to a trailing newline after an
    unclosed tag, which that ``$`` keeps), in linear time (that lazy regex is quadratic on many unclosed tags)."""
    o, c = f"<{name}>", f"</{name}>"
    out, pos = [], 0
    while (start := text.find(o, pos)) >= 0:
        out.append(text[pos:start])
        end = text.find(c, start + len(o))
        if end < 0:
            return "".join(out) + ("\n" if text.endswith("\n") else "")
        pos = end + len(c)
    out.append(text[pos:])
    return "".join(out)


def first_query(text: str, spans: list[TagSpan]) -> TagSpan | None:
    """The query a turn ran: its first ``<search>`` span, if its query is not empty (the loop runs the
    first query of a reply and, like :func:`attnprobe.generation.toolparse.parse_tags`, reads only up to the
    first ``</search>`` and ignores an empty query)."""
    first = next((s for s in spans if s.kind == "search"), None)
    return first if first is not None and first.inner(text).strip() else None
