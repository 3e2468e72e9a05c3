"""Seed 002's browser: ``search`` / ``open`` / ``find`` over a persistent, append-only page pool.

Seed 002 §2.3: "A persistent page pool preserves historical pages independently of masked context, while
search, open, and find separate exploration, reading, and localization. The append-only pool deduplicates
URLs and assigns stable cursors, allowing historical pages to be referenced without repeating a search."

- Every page a search returns or ``open`` reaches gets a cursor (0, 1, 2, ...) the first time its URL is
  seen; the same URL always keeps its cursor, and nothing is ever removed, so a cursor in a masked
  observation still opens its page later.
- Pages are split into numbered lines (sentences); ``open`` shows ``num_lines`` lines from ``loc``
  (appendix C: "default open lines is 50"), ``find`` the lines containing a pattern, matched literally.
- A failed call returns text starting with ``Error:`` (seed 002 keeps those unmasked).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from attnprobe.agents.search import SearchBackend
from attnprobe.agents.tools import arg, call_args
from attnprobe.generation.chat import RAW_ARGUMENTS


def _tool(name: str, description: str, params: dict[str, tuple[str, str]], required: list[str]) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object",
                       "properties": {k: {"type": t, "description": d} for k, (t, d) in params.items()},
                       "required": required}}}


SEARCH = _tool("search", "Search for pages; returns results with their cursor numbers, titles, URLs and snippets.",
               {"query": ("string", "The search query.")}, ["query"])
OPEN = _tool("open", "Open a page by cursor number or URL; returns its numbered lines from line loc on.",
             {"id": ("string", "Cursor number or URL of a page."), "loc": ("integer", "First line to show (0).")},
             ["id"])
FIND = _tool("find", "Find the lines of a page that contain a pattern (exact text, case-insensitive).",
             {"id": ("string", "Cursor number or URL of a page."), "pattern": ("string", "The text to look for.")},
             ["id", "pattern"])
TOOLS = [SEARCH, OPEN, FIND]

_SENT = re.compile(r"(?<=[^\d\s][.!?])\s+(?=[A-Z0-9\[(])|\n+")


@dataclass
class Page:
    cursor: int
    url: str
    title: str
    lines: list[str] | None = None  # None until opened (search results carry a snippet only)


@dataclass
class PagePool:
    """The append-only pool. ``cursor(url)`` gives a URL its stable number (deduplicated)."""

    pages: list[Page] = field(default_factory=list)
    by_url: dict[str, int] = field(default_factory=dict)

    def cursor(self, url: str, title: str = "") -> int:
        key = url.strip()
        if key not in self.by_url:
            self.by_url[key] = len(self.pages)
            self.pages.append(Page(len(self.pages), key, title))
        page = self.pages[self.by_url[key]]
        if title and not page.title:
            page.title = title
        return page.cursor

    def to_dict(self) -> list[dict]:
        return [{"cursor": p.cursor, "url": p.url, "title": p.title, "opened": p.lines is not None}
                for p in self.pages]


class Browser:
    """Executes the three tools against a search backend; every call returns the observation text."""

    def __init__(self, search: SearchBackend, *, top_k: int = 15, open_lines: int = 50):
        self.search_backend = search
        self.top_k = top_k
        self.open_lines = open_lines
        self.pool = PagePool()
        self.searches = 0

    def _page(self, ident: str) -> Page | str:
        ident = ident.strip().strip("[]<>()\"'")
        if ident.isdigit():
            c = int(ident)
            if c >= len(self.pool.pages):
                return f"Error: no page with cursor {c} in the pool (cursors 0-{len(self.pool.pages) - 1})."
            page = self.pool.pages[c]
        elif ident:
            page = self.pool.pages[self.pool.cursor(ident)]
        else:
            return "Error: give the cursor number or the URL of a page."
        if page.lines is None:
            text = self.search_backend.fetch(page.url)
            if text is None:
                return f"Error: could not open {page.url}."
            page.lines = [s.strip() for s in _SENT.split(text) if s and s.strip()]
        return page

    def search(self, query: str) -> str:
        if not query:
            return "Error: search needs a non-empty 'query'."
        self.searches += 1
        results = self.search_backend.search(query, self.top_k)
        if not results:
            return f"No results for {query!r}."
        return "\n".join(f"[{self.pool.cursor(r.url, r.title)}] {r.title} ({r.url})\n{r.snippet}" for r in results)

    def open(self, ident: str, loc: int = 0) -> str:
        page = self._page(ident)
        if isinstance(page, str):
            return page
        lines = page.lines or []
        loc = max(0, loc)
        shown = lines[loc: loc + self.open_lines]
        body = "\n".join(f"L{loc + i}: {s}" for i, s in enumerate(shown))
        more = f"\n(lines {loc}-{loc + len(shown) - 1} of {len(lines)})" if shown else f"\n(no line {loc})"
        return f"[{page.cursor}] {page.title} ({page.url})\n{body}{more}"

    def find(self, ident: str, pattern: str) -> str:
        if not pattern.strip():
            return "Error: find needs a 'pattern'."
        page = self._page(ident)
        if isinstance(page, str):
            return page
        needle = pattern.strip().lower()
        hits = [f"L{i}: {s}" for i, s in enumerate(page.lines or []) if needle in s.lower()]
        if not hits:
            return f"No line of [{page.cursor}] contains {pattern!r}."
        return f"[{page.cursor}] {page.title}\n" + "\n".join(hits)

    def execute(self, call: dict) -> str:
        """Run one OpenAI-format tool call; one whose arguments were no JSON object (kept in
        :data:`~attnprobe.generation.chat.RAW_ARGUMENTS`) is not run: its observation is an error."""
        name = call["function"]["name"]
        if RAW_ARGUMENTS in call:
            raw = call[RAW_ARGUMENTS]
            shown = repr(raw) if len(raw) <= 120 else repr(raw[:117]) + "..."
            return f"Error: the arguments of {name!r} are not a JSON object ({shown}); nothing was run."
        args = call_args(call)
        if name == "search":
            return self.search(arg(args, "query", "q"))
        if name in ("open", "find"):
            key = next((k for k in ("id", "cursor", "url") if k in args), None)
            ident = str(args[key]).strip() if key else arg(args, "id")
            if name == "open":
                try:
                    loc = int(args.get("loc", 0) or 0)
                except (TypeError, ValueError):
                    return "Error: open's 'loc' must be a line number."
                return self.open(ident, loc)
            return self.find(ident, str(args.get("pattern", "")))
        return f"Error: unknown tool {name!r}; use search, open or find."
